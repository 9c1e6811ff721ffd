"""The `ai` package's own client (Node, the version tests/node/package-lock.json pins) drives
the AI SDK chat endpoint on a live stack: Priya's seven turns with the email approval, a
resend, a Stop, a resume and a hand-off to a person (tests/node/chat.test.mjs; the same
script runs against `make run` in tests/system/test_make_run.py). A new `ai` release that
changes the protocol fails here: bump the pin, run this, and fix what it finds."""

from __future__ import annotations

from pathlib import Path

from parley.store.db import Database
from parley.store.identity import create_token
from tests.support.ai_client import ChatTarget, passed, run_chat_client
from tests.support.models import ControlledModel
from tests.support.toolkit import Stack


async def test_the_ai_client_holds_the_conversation(
    stack: Stack[ControlledModel],
    node_folder: Path,
    long_question: str,
    tokens: dict[str, str],
    northwind_url: str,
    sessions: Database,
) -> None:
    async with sessions() as db:
        sam = await create_token(db, tenant_id="northwind", user_id="agent_sam")
        await db.commit()
    target = ChatTarget(stack.url, tokens["priya"], sam, northwind_url, long_question)
    report = await run_chat_client(node_folder, target)
    assert passed(report) == 5, report
