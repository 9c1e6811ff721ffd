"""The `ai` package's own client (Node, the version tests/node/package-lock.json pins) drives
the AI SDK chat endpoint on a live stack: Priya's seven turns with the email approval, a
resend, a Stop and a resume (tests/node/chat.test.mjs). A new `ai` release that changes the
protocol fails here: bump the pin, run this, and fix what it finds."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from tests.support.models import ControlledModel
from tests.support.toolkit import Stack

NODE_TIMEOUT_S = 150


async def test_the_ai_client_holds_the_conversation(
    stack: Stack[ControlledModel],
    node_folder: Path,
    long_reply: str,
    tokens: dict[str, str],
    northwind_url: str,
) -> None:
    env = {
        **os.environ,
        "PARLEY_URL": stack.url,
        "PARLEY_TOKEN": tokens["priya"],
        "NORTHWIND_URL": northwind_url,
        "LONG": long_reply,
    }
    node = await asyncio.create_subprocess_exec(
        "node",
        "--test-reporter=spec",
        "--test",
        "chat.test.mjs",
        cwd=node_folder,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        out, _ = await asyncio.wait_for(node.communicate(), NODE_TIMEOUT_S)
    except TimeoutError:
        node.kill()
        await node.wait()
        raise
    report = out.decode()
    assert node.returncode == 0, report
    assert "# fail 0" in report or "fail 0" in report, report
    assert "pass 4" in report, report
