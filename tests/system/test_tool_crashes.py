"""Crashes around tools: a worker killed with SIGKILL while an email is in flight, while a
turn rests awaiting confirmation, during a read tool, and while the proposal is worded; a new
worker finishes the turn.

Issue acceptance 2. Real worker processes on their own task queue, a real API in this
process and the real Northwind backend over HTTP, whose faults open the window to kill in:
`email_post_accept_latency_ms` makes the email service record an email and then hold its
answer, and `latency_ms` holds a read. Checked: at most one email per proposal, each tool's
result stored once, and the turn completes with one answer.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
import pytest_asyncio
from sqlalchemy import select
from temporalio.client import Client

from parley.config import Settings
from parley.contracts import SA_TURN_STATE
from parley.ids import workflow_id_for_turn
from parley.store.db import Database
from parley.store.models import Action, Message, ToolCall, Turn
from tests.support.client import ParleyClient
from tests.support.orm import orm
from tests.support.processes import Workers, read_until
from tests.support.sse import Event
from tests.support.stack import own_queue, serve_api
from tests.support.toolkit import emails, eventually

# How long a turn may take to finish after a kill: a ~5 s heartbeat or workflow task timeout
# for the killed step, a ~3 s sticky-queue timeout for the next task, and the new worker's
# start-up.
RECOVERY_S = 45


@pytest.fixture(scope="module")
def tool_crash_settings(settings: Settings) -> Settings:
    # A generous HTTP timeout, so a held answer is cut short only by the kill, never by
    # the worker's own timeout (which would retry before the crash this file is about).
    return own_queue(settings, "toolcrash", tool_timeout_s=10.0)


@pytest.fixture
def workers(tool_crash_settings: Settings) -> Iterator[Workers]:
    pool = Workers(tool_crash_settings)
    yield pool
    pool.stop_all()


@pytest_asyncio.fixture(scope="module")
async def tool_crash_api(tool_crash_settings: Settings, sessions: object) -> AsyncIterator[str]:
    async with serve_api(tool_crash_settings) as url:
        yield url


@pytest_asyncio.fixture
async def client(tool_crash_api: str, tokens: dict[str, str]) -> AsyncIterator[ParleyClient]:
    priya = ParleyClient(tool_crash_api, tokens["priya"])
    yield priya
    await priya.aclose()


# --- helpers ------------------------------------------------------------------------------


def kill(process: subprocess.Popen[bytes]) -> None:
    """`kill -9`: no drain, no goodbye to Temporal."""
    assert process.poll() is None, "the worker died before the test killed it"
    process.send_signal(signal.SIGKILL)
    process.wait(10)


def events_url(session_id: str, turn_id: str) -> str:
    return f"/v1/sessions/{session_id}/turns/{turn_id}/events"


async def follow(client: ParleyClient, url: str, *, after: int, stop: str) -> list[Event]:
    return await asyncio.wait_for(read_until(client, url, after=after, stop=stop), RECOVERY_S)


async def wait_for_email(northwind: httpx.AsyncClient, action_id: str) -> None:
    async def accepted() -> list[Any]:
        return await emails(northwind, action_id=action_id)

    await eventually(accepted, timeout=15, what=f"an email accepted for {action_id}")


async def last_seq(client: ParleyClient, session_id: str) -> int:
    return int((await client.session_view(session_id))["last_seq"])


async def stored_action(sessions: Database, action_id: str) -> Action:
    async with orm(sessions) as db:
        action = await db.get(Action, action_id)
    assert action is not None
    return action


def tool_phases(events: list[Event], name: str) -> list[str]:
    return [e.data["phase"] for e in events if e.type == "tool" and e.data["name"] == name]


async def propose_email(client: ParleyClient) -> tuple[str, str, list[Event], dict[str, Any]]:
    """A session with an active order and a turn resting on an email proposal."""
    session_id = await client.new_session()
    _, events = await client.turn(session_id, "Where is my order?")
    assert events[-1].type == "done", [e.type for e in events]
    posted = await client.post(session_id, "Can you email me?")
    assert posted.status_code == 202, posted.text
    turn_id = posted.json()["turn_id"]
    events = await follow(
        client, events_url(session_id, turn_id), after=0, stop="confirmation_required"
    )
    assert events[-1].type == "confirmation_required", [e.type for e in events]
    action = events[-1].data["action"]
    assert action["tool"] == "send_email" and action["status"] == "pending"
    return session_id, turn_id, events, action


async def confirm_and_finish(
    client: ParleyClient,
    session_id: str,
    turn_id: str,
    events: list[Event],
    action_id: str,
    *,
    before_follow: Any = None,
) -> list[Event]:
    """Confirm, optionally crash something, then follow the stream to its end."""
    confirmed = await client.http.post(f"/v1/sessions/{session_id}/actions/{action_id}/confirm")
    assert confirmed.status_code == 202, confirmed.text
    assert confirmed.json()["action"]["status"] == "confirmed"
    if before_follow is not None:
        await before_follow()
    rest = await follow(
        client, events_url(session_id, turn_id), after=events[-1].id or 0, stop="done"
    )
    everything = events + rest
    assert [e.id for e in everything] == list(range(1, len(everything) + 1))
    assert rest[-1].type == "done", [e.type for e in rest]
    return rest


async def assert_sent_once(
    client: ParleyClient,
    northwind: httpx.AsyncClient,
    sessions: Database,
    *,
    session_id: str,
    action_id: str,
    emails_before: list[dict[str, Any]],
    seq_at_confirm: int,
    rest: list[Event],
) -> None:
    key = f"parley-{action_id}"
    after = await emails(northwind)
    assert [e["idempotency_key"] for e in after if e["idempotency_key"] == key] == [key]
    new = after[len(emails_before) :]
    assert [(e["to"], e["idempotency_key"]) for e in new] == [("priya@example.com", key)]

    final = rest[-1].data["message"]
    text = final["text"].lower()
    assert "sent" in text or "accepted" in text, final["text"]
    assert "deliver" not in text, final["text"]
    resolved = [e.data["action"]["status"] for e in rest if e.type == "confirmation_resolved"]
    assert resolved == ["confirmed"]
    # The send is announced once, however many attempts it took.
    assert tool_phases(rest, "send_email") == ["start", "end"]
    ends = [e.data for e in rest if e.type == "tool" and e.data["phase"] == "end"]
    assert ends[-1]["status"] == "ok"

    action = await stored_action(sessions, action_id)
    assert action.status == "executed"
    assert action.outcome is not None and action.outcome.get("accepted") is True

    answers = [
        m
        for m in await client.messages(session_id, after_seq=seq_at_confirm)
        if m["role"] == "assistant"
    ]
    assert [(m["id"], m["text"]) for m in answers] == [(final["id"], final["text"])]
    async with orm(sessions) as db:
        stored = (
            await db.scalars(
                select(Message).where(
                    Message.session_id == session_id,
                    Message.seq > seq_at_confirm,
                    Message.role == "assistant",
                )
            )
        ).all()
    assert [m.id for m in stored] == [final["id"]]


# --- the tests ----------------------------------------------------------------------------


async def test_worker_killed_after_the_email_service_accepted_sends_exactly_one_email(
    client: ParleyClient,
    workers: Workers,
    northwind: httpx.AsyncClient,
    sessions: Database,
) -> None:
    first = workers.start()
    session_id, turn_id, events, action = await propose_email(client)
    emails_before = await emails(northwind)
    seq_at_confirm = await last_seq(client, session_id)

    async def crash_after_acceptance() -> None:
        # The email is recorded; its answer is held for 4 s. Kill inside that window.
        await wait_for_email(northwind, action["id"])
        kill(first)
        await northwind.delete("/faults")
        # The crash hit between acceptance and the activity's completion.
        assert (await stored_action(sessions, action["id"])).status == "confirmed"
        workers.start()

    try:
        await northwind.delete("/stats")
        await northwind.post("/faults", json={"email_post_accept_latency_ms": 4000})
        rest = await confirm_and_finish(
            client, session_id, turn_id, events, action["id"], before_follow=crash_after_acceptance
        )
    finally:
        await northwind.delete("/faults")

    await assert_sent_once(
        client,
        northwind,
        sessions,
        session_id=session_id,
        action_id=action["id"],
        emails_before=emails_before,
        seq_at_confirm=seq_at_confirm,
        rest=rest,
    )
    # The new worker's attempt asked again under the same key and got the first answer.
    stats = (await northwind.get("/stats")).json()["calls"]
    assert stats["send_email"] == 2


async def test_worker_killed_while_awaiting_confirmation_then_confirmed_sends_one_email(
    client: ParleyClient,
    workers: Workers,
    northwind: httpx.AsyncClient,
    sessions: Database,
    temporal_client: Client,
) -> None:
    first = workers.start()
    session_id, turn_id, events, action = await propose_email(client)

    # Wait until the workflow itself rests (its task that entered the wait is completed).
    handle = temporal_client.get_workflow_handle(workflow_id_for_turn(turn_id))

    async def resting() -> bool:
        described = await handle.describe()
        return described.typed_search_attributes.get(SA_TURN_STATE) == "awaiting_confirmation"

    await eventually(resting, timeout=15, what="the turn rests awaiting confirmation")
    async with orm(sessions) as db:
        turn = await db.get(Turn, turn_id)
        assert turn is not None and turn.state == "awaiting_confirmation"

    kill(first)
    emails_before = await emails(northwind)
    seq_at_confirm = await last_seq(client, session_id)
    workers.start()

    rest = await confirm_and_finish(client, session_id, turn_id, events, action["id"])
    await assert_sent_once(
        client,
        northwind,
        sessions,
        session_id=session_id,
        action_id=action["id"],
        emails_before=emails_before,
        seq_at_confirm=seq_at_confirm,
        rest=rest,
    )
    async with orm(sessions) as db:
        turn = await db.get(Turn, turn_id)
        assert turn is not None and turn.state == "completed"
        assert turn.assistant_message_id == rest[-1].data["message"]["id"]


async def test_worker_killed_during_a_read_tool_stores_one_result_and_answers_right(
    client: ParleyClient,
    workers: Workers,
    northwind: httpx.AsyncClient,
    sessions: Database,
) -> None:
    first = workers.start()
    session_id = await client.new_session()
    try:
        await northwind.delete("/stats")
        await northwind.post("/faults", json={"latency_ms": 3000})
        posted = await client.post(session_id, "Where is my order?")
        assert posted.status_code == 202, posted.text
        turn_id = posted.json()["turn_id"]
        url = events_url(session_id, turn_id)

        before = await follow(client, url, after=0, stop="tool")
        assert before[-1].type == "tool", [e.type for e in before]
        assert before[-1].data["name"] == "list_open_orders"
        assert before[-1].data["phase"] == "start"

        # The tool's request is in flight, held by the backend.
        async def reached_backend() -> bool:
            return bool((await northwind.get("/stats")).json()["calls"]["list_orders"] >= 1)

        await eventually(reached_backend, timeout=5, what="the tool calls the backend")
        kill(first)
    finally:
        await northwind.delete("/faults")
    workers.start()

    after = await follow(client, url, after=before[-1].id or 0, stop="done")
    events = before + after
    assert [e.id for e in events] == list(range(1, len(events) + 1))
    assert events[-1].type == "done", [e.type for e in events]
    text = events[-1].data["message"]["text"]
    assert "8472" in text and "shipped" in text and "Oct 30" in text, text
    assert tool_phases(events, "list_open_orders") == ["start", "end"]
    assert not [e for e in events if e.type in ("warning", "error")]

    async with orm(sessions) as db:
        calls = (await db.scalars(select(ToolCall).where(ToolCall.turn_id == turn_id))).all()
        tool_messages = (
            await db.scalars(
                select(Message).where(Message.session_id == session_id, Message.role == "tool")
            )
        ).all()
    assert [(c.name, c.status) for c in calls] == [("list_open_orders", "ok")]
    call = calls[0]
    assert call.attempts == 2  # the killed attempt, then the new worker's
    assert call.result is not None and [o["order_id"] for o in call.result["orders"]] == ["8472"]
    assert [m.tool_call_id for m in tool_messages] == [call.provider_call_id]
    # The killed attempt reached the backend and so did the retry; nothing ran a third time.
    assert (await northwind.get("/stats")).json()["calls"]["list_orders"] == 2


async def test_worker_killed_while_the_proposal_is_worded_shows_one_card_and_sends_once(
    client: ParleyClient,
    tool_crash_settings: Settings,
    northwind: httpx.AsyncClient,
    sessions: Database,
) -> None:
    """The step after `propose_email` (context, the model wording the proposal, the card)
    is one workflow task of local steps: killed in it, the next worker runs it again."""
    # A slow model for the first worker only, so the kill lands while the proposal streams.
    slow = Workers(tool_crash_settings.model_copy(update={"demo_token_delay_ms": 150.0}))
    fresh = Workers(tool_crash_settings)
    try:
        first = slow.start()
        session_id = await client.new_session()
        _, opening = await client.turn(session_id, "Where is my order?")
        assert opening[-1].type == "done", [e.type for e in opening]
        posted = await client.post(session_id, "Can you email me?")
        assert posted.status_code == 202, posted.text
        turn_id = posted.json()["turn_id"]
        url = events_url(session_id, turn_id)

        before = await follow(client, url, after=0, stop="tool")
        while not (before[-1].type == "delta" and tool_phases(before, "propose_email")):
            before += await follow(client, url, after=before[-1].id or 0, stop="delta")
        assert before[-1].type == "delta"
        kill(first)
        async with orm(sessions) as db:
            turn = await db.get(Turn, turn_id)
            assert turn is not None and turn.state == "calling_model"  # not yet resting
        fresh.start()

        rest = await follow(client, url, after=before[-1].id or 0, stop="confirmation_required")
        events = before + rest
        assert [e.id for e in events] == list(range(1, len(events) + 1))
        assert "reset" in [e.type for e in rest]  # the cut proposal is streamed again
        cards = [e.data["action"] for e in events if e.type == "confirmation_required"]
        assert len(cards) == 1 and cards[0]["status"] == "pending"
        assert tool_phases(events, "propose_email") == ["start", "end"]

        emails_before = await emails(northwind)
        seq_at_confirm = await last_seq(client, session_id)
        done = await confirm_and_finish(client, session_id, turn_id, events, cards[0]["id"])
        await assert_sent_once(
            client,
            northwind,
            sessions,
            session_id=session_id,
            action_id=cards[0]["id"],
            emails_before=emails_before,
            seq_at_confirm=seq_at_confirm,
            rest=done,
        )
    finally:
        slow.stop_all()
        fresh.stop_all()
