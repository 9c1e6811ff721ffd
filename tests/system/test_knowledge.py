"""Knowledge through the public API: a policy question answered from the warranty document
with a `citations` event; another tenant's canary passage never reaching Northwind's prompts,
events, logs or trace; a search that fails degrading the turn instead of failing it."""

from __future__ import annotations

import json
import logging
import uuid
from typing import Any

import pytest
from sqlalchemy import select
from temporalio.client import Client

from parley.config import Settings
from parley.gateway.demo import DemoModel
from parley.knowledge import parse_document
from parley.launch.knowledge import load_library
from parley.store.db import Database
from parley.store.identity import create_token
from parley.store.models import ModelCall, TraceSpan, Turn, TurnEvent
from tests.support.client import ParleyClient
from tests.support.orm import orm
from tests.support.stack import free_port
from tests.support.toolkit import own_stack, reply

POLICY_QUESTIONS = [
    "What is your policy on damaged items?",
    "What does the warranty cover if an item arrives broken or damaged?",
    "What are your shipping costs and the return window policy?",
]


def canary_document(canary: str, *, mode: str) -> str:
    """Another tenant's document, written to match Northwind's policy questions."""
    return f"""---
title: Damaged items policy and warranty
mode: {mode}
---

## Damaged items, warranty, shipping costs and the return window

Our policy on damaged or broken items: {canary}. The warranty covers items that arrive
damaged; shipping costs and the return window policy are set out here too.
"""


async def everything_of(sessions: Database, session_ids: list[str]) -> str:
    """Every stored prompt, event and trace span of the sessions' turns, as one text."""
    async with orm(sessions) as db:
        turn_ids = list(await db.scalars(select(Turn.id).where(Turn.session_id.in_(session_ids))))
        calls = await db.scalars(select(ModelCall.request).where(ModelCall.turn_id.in_(turn_ids)))
        events = await db.scalars(select(TurnEvent.data).where(TurnEvent.turn_id.in_(turn_ids)))
        spans = await db.scalars(select(TraceSpan.attrs).where(TraceSpan.turn_id.in_(turn_ids)))
        return json.dumps([list(calls), list(events), list(spans)])


async def test_policy_answered_from_the_warranty_document_and_another_tenants_canary_never_leaks(
    priya: ParleyClient,
    api_url: str,
    tokens: dict[str, str],
    sessions: Database,
    caplog: pytest.LogCaptureFixture,
) -> None:
    canary = f"CANARY-{uuid.uuid4().hex}"
    tag = uuid.uuid4().hex[:6]
    async with sessions() as db:
        await load_library(
            db,
            {
                "southwind": [
                    parse_document(canary_document(canary, mode="retrieved"), doc=f"c-{tag}"),
                    parse_document(canary_document(canary, mode="always"), doc=f"a-{tag}"),
                ]
            },
        )
        await db.commit()
    caplog.set_level(logging.DEBUG)

    sid = await priya.new_session()
    _, events = await priya.turn(sid, POLICY_QUESTIONS[0])
    text = reply(events)
    assert "14 days" in text, text  # the warranty document's damaged-on-arrival section
    types = [e.type for e in events]
    assert "citations" in types and types.index("citations") < types.index("done"), types
    citations = next(e.data for e in events if e.type == "citations")
    assert citations["message_id"] == events[-1].data["message"]["id"]
    assert {s["doc"] for s in citations["sources"]} == {"warranty-and-damaged-items"}
    assert all(s["section"] and s["version"] >= 1 for s in citations["sources"])
    for question in POLICY_QUESTIONS[1:]:
        _, more = await priya.turn(sid, question)
        reply(more)
        events += more

    northwind = await everything_of(sessions, [sid])
    assert canary not in northwind
    assert all(canary not in json.dumps(e.data) for e in events)
    assert canary not in caplog.text

    # The scan can see a canary where one belongs: the other tenant's own turn shows it.
    ines = ParleyClient(api_url, tokens["ines"])
    try:
        other = await ines.new_session()
        _, theirs = await ines.turn(other, POLICY_QUESTIONS[0])
        reply(theirs)
    finally:
        await ines.aclose()
    assert canary in await everything_of(sessions, [other])


async def test_a_failed_search_degrades_the_turn_with_a_warning(
    settings: Settings,
    temporal_client: Client,
    sessions: Database,
) -> None:
    """The embedding server is down: the answer still comes, from full-text search, cited,
    and the stream says the search was degraded."""
    model = DemoModel(token_delay_s=0.001)
    dead = f"http://127.0.0.1:{free_port()}/v1"
    async with own_stack(
        temporal_client,
        settings,
        sessions,
        model,
        prefix="knowledge",
        embedding_model="fake-hashed-bow-256",
        embedding_base_url=dead,
    ) as stack:
        async with sessions() as db:
            token = await create_token(db, tenant_id="northwind", user_id="cust_3301")
            await db.commit()
        client = ParleyClient(stack.url, token)
        try:
            sid = await client.new_session()
            _, events = await client.turn(sid, POLICY_QUESTIONS[0])
        finally:
            await client.aclose()
    warnings: list[dict[str, Any]] = [e.data for e in events if e.type == "warning"]
    assert [w["code"] for w in warnings] == ["knowledge_unavailable"], warnings
    assert "14 days" in reply(events)
    assert any(e.type == "citations" for e in events)
