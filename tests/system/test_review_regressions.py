"""Regressions for defects found in review: each test failed before its fix."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import httpx
from sqlalchemy import select
from temporalio.client import Client

from parley.contracts import ResolveActionSignal
from parley.dispatch.control import deliver_decision
from parley.store import actions
from parley.store.db import Database
from parley.store.identity import Identity
from parley.store.models import ModelCall, ToolCall
from tests.support.client import ParleyClient
from tests.support.models import ControlledModel
from tests.support.orm import orm
from tests.support.toolkit import Stack, first_events, post_unstarted, wait_for_stored_state


async def test_cancelling_during_a_tool_leaves_no_unanswered_call_behind(
    stream_stack: Stack[ControlledModel],
    stream_client: ParleyClient,
    northwind: httpx.AsyncClient,
    sessions: Database,
) -> None:
    await northwind.post("/faults", json={"latency_ms": 3000})
    sid = await stream_client.new_session()
    posted = await stream_client.post(sid, "Where is my order?")
    turn_id = posted.json()["turn_id"]
    await first_events(stream_client, posted.json()["events_url"], until="tool")
    assert (
        await stream_client.http.post(f"/v1/sessions/{sid}/turns/{turn_id}/cancel")
    ).status_code == 202
    await wait_for_stored_state(sessions, turn_id, {"cancelled"}, timeout=15)
    await northwind.delete("/faults")
    async with orm(sessions) as db:
        calls = list(await db.scalars(select(ToolCall).where(ToolCall.turn_id == turn_id)))
    assert calls and all(c.status != "pending" for c in calls)

    # The next turn's prompt pairs every tool call with its result.
    next_turn, events = await stream_client.turn(sid, "Hello again")
    assert events[-1].type == "done"
    async with orm(sessions) as db:
        request = await db.scalar(select(ModelCall.request).where(ModelCall.turn_id == next_turn))
    assert request is not None
    asked = {c["id"] for m in request["messages"] for c in m.get("tool_calls") or []}
    answered = {m["tool_call_id"] for m in request["messages"] if m["role"] == "tool"}
    assert asked <= answered


async def test_a_message_right_after_a_confirmation_waits_for_that_turn(
    priya: ParleyClient,
    sessions: Database,
    temporal_client: Client,
) -> None:
    sid = await priya.new_session()
    await priya.turn(sid, "Where is my order?")
    posted = await priya.post(sid, "Can you email me?")
    turn_id = posted.json()["turn_id"]
    events = await priya.events(sid, turn_id)
    action_id = events[-1].data["action"]["id"]
    # Confirmed in the store, the decision not yet delivered: the turn is about to resume.
    async with sessions() as db:
        await actions.resolve_action(
            db, action_id=action_id, session_id=sid, owner=None, decision="confirmed"
        )
        await db.commit()
    # Not a decision on the card (that is answered) and not a new turn beside it: it is
    # queued as the session's next turn (issue 30 item 4).
    waiting = await priya.post(sid, "And another thing")
    assert waiting.status_code == 202 and waiting.json()["state"] == "queued"
    busy = await priya.post(sid, "And one more")
    assert busy.status_code == 409
    assert busy.json()["error"]["code"] == "turn_in_progress"
    assert busy.json()["error"]["active_turn_id"] == turn_id
    confirmed = ResolveActionSignal(action_id, "confirmed")
    assert await deliver_decision(temporal_client, turn_id=turn_id, decision=confirmed)
    rest = await priya.events(sid, turn_id, last_event_id=events[-1].id)
    assert rest[-1].type == "done"
    # The turn's end promoted the queued one, whose ring names this stack's queue: its
    # worker starts it, and it is answered after the confirmed turn.
    queued_id = waiting.json()["turn_id"]
    after = await asyncio.wait_for(priya.events(sid, queued_id), 60)
    assert after[-1].type == "done"
    said = [m["text"] for m in await priya.messages(sid) if m["role"] == "user"]
    assert said[-1] == "And another thing"


async def test_a_retried_proposal_finds_its_action(sessions: Database, priya: ParleyClient) -> None:
    # A turn still running (its workflow held back by `started`), as a proposal step finds it.
    sid = await priya.new_session()
    async with sessions() as db:
        posted = await post_unstarted(
            db,
            owner=Identity(tenant_id="northwind", user_id="cust_2291", roles=()),
            text="Can you email me?",
            session_id=sid,
        )
    fields = {
        "turn": posted.turn,
        "action_id": "act_retry_probe",
        "tool": "send_email",
        "args": {"to": "priya@example.com"},
        "summary": "probe",
        "recipient_masked": "p***@example.com",
        "ttl": timedelta(minutes=1),
    }
    async with sessions() as db:
        first = await actions.create_action(db, **fields)  # type: ignore[arg-type]
        await db.commit()
    async with sessions() as db:
        again = await actions.create_action(db, **fields)  # type: ignore[arg-type]
        await db.commit()
    assert again.id == first.id and again.args_hash == first.args_hash
