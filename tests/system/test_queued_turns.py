"""A message posted while an answer streams is the session's next turn (issue 30 item 4):
202 `queued`, started by the outbox the moment the running turn ends, both turns' events
complete and in order; a third post is 409. And the outbox's sweep starts a queued turn
whose moment nobody heard (no worker was up when the running turn ended).

Real worker processes on their own task queue, as in production: the outbox loop (with its
bell) runs only in `parley worker`.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest
import pytest_asyncio
from sqlalchemy import select

from parley.config import Settings
from parley.contracts import TurnState
from parley.store import posting, turns
from parley.store.db import Database
from parley.store.identity import Identity
from parley.store.models import TurnEvent
from tests.support.client import ParleyClient
from tests.support.orm import orm
from tests.support.processes import Workers, follow, read_until, ring_until
from tests.support.sse import Event
from tests.support.stack import LIFTED_LIMITS, own_queue, serve_api
from tests.support.toolkit import stored_state

PRIYA = Identity(tenant_id="northwind", user_id="cust_2291", roles=())


@pytest.fixture(scope="module")
def queue_settings(settings: Settings) -> Settings:
    # Slow tokens: time to post while the first answer streams.
    return own_queue(settings, "queued", demo_token_delay_ms=40)


@pytest.fixture
def workers(queue_settings: Settings) -> Iterator[Workers]:
    pool = Workers(queue_settings)
    yield pool
    pool.stop_all()


@pytest_asyncio.fixture(scope="module")
async def queue_api(queue_settings: Settings, sessions: object) -> AsyncIterator[str]:
    async with serve_api(queue_settings) as url:
        yield url


@pytest_asyncio.fixture
async def priya(queue_api: str, tokens: dict[str, str]) -> AsyncIterator[ParleyClient]:
    client = ParleyClient(queue_api, tokens["priya"])
    yield client
    await client.aclose()


def _said(message: dict[str, object]) -> bool:
    """A message of the conversation as read: the user's, or an answer (not a tool step)."""
    return message["role"] == "user" or (
        message["role"] == "assistant" and not message.get("tool_calls")
    )


def _dense(events: list[Event]) -> bool:
    return [e.id for e in events] == list(range(1, len(events) + 1))


async def _logged_at(sessions: Database, turn_id: str) -> list[float]:
    async with orm(sessions) as db:
        stamps = await db.scalars(
            select(TurnEvent.created_at).where(TurnEvent.turn_id == turn_id).order_by(TurnEvent.id)
        )
        return [s.timestamp() for s in stamps]


async def test_a_message_posted_while_an_answer_streams_is_the_next_turn(
    priya: ParleyClient, workers: Workers, sessions: Database, queue_settings: Settings
) -> None:
    # The periodic sweep runs once at start, then not within this test: only the bell the
    # first turn's ending rings can start the queued turn in time.
    workers.env["PARLEY_OUTBOX_POLL_S"] = "600"
    workers.start()
    sid = await priya.new_session()
    first = await priya.post(sid, "Tell me about yourself, please.")
    assert first.status_code == 202 and first.json()["state"] == "received"

    async def started() -> bool:
        return await stored_state(sessions, first.json()["turn_id"]) != TurnState.received

    await ring_until(sessions, queue_settings, first.json()["turn_id"], started, what="started")
    first_url = first.json()["events_url"]
    seen_first = await read_until(priya, first_url, after=0, stop="delta")
    assert seen_first[-1].type == "delta"

    second = await priya.post(sid, "And what can you do about returns?")
    assert second.status_code == 202
    assert second.json()["state"] == TurnState.queued
    second_id = second.json()["turn_id"]
    assert second_id != first.json()["turn_id"]
    third = await priya.post(sid, "Hello?")
    assert third.status_code == 409
    assert third.json()["error"]["code"] == "turn_in_progress"

    await follow(priya, first_url, seen_first, timeout=60)
    first_done = time.monotonic()
    seen_second: list[Event] = []
    await follow(priya, second.json()["events_url"], seen_second, timeout=60)

    assert seen_first[-1].type == "done" and _dense(seen_first)
    assert seen_second[-1].type == "done" and _dense(seen_second)
    states = [e.data["state"] for e in seen_second if e.type == "state"]
    assert states[:3] == ["queued", "received", "building_context"]
    assert "delta" in [e.type for e in seen_second]
    # Started at once, not by the sweep (it would wait ten minutes).
    assert time.monotonic() - first_done < 30
    # In order: the queued turn was promoted as the first ended, and ran after it.
    first_log = await _logged_at(sessions, first.json()["turn_id"])
    second_log = await _logged_at(sessions, second_id)
    assert second_log[1] >= first_log[-1] and second_log[2] >= first_log[-1]
    # The transcript reads in the order the model answered.
    messages = await priya.messages(sid)
    assert [m["seq"] for m in messages] == list(range(1, len(messages) + 1))
    said = [(m["role"], m["turn_id"]) for m in messages if _said(m)]
    assert said == [
        ("user", first.json()["turn_id"]),
        ("assistant", first.json()["turn_id"]),
        ("user", second_id),
        ("assistant", second_id),
    ]
    asked = next(m for m in messages if m["turn_id"] == second_id)
    assert asked["text"] == "And what can you do about returns?"
    assert asked["id"] == second.json()["message"]["id"]
    # The session takes a new message once both are done.
    assert (await priya.post(sid, "Thanks!")).json()["state"] == "received"


async def test_a_queued_turn_nobody_heard_is_started_by_the_sweep(
    priya: ParleyClient, workers: Workers, sessions: Database
) -> None:
    """The running turn ends while no worker listens (they are all down, or the process that
    would start the queued turn died after the end): the outbox's sweep starts it."""
    sid = await priya.new_session()
    # A committed turn nobody started (no worker is up), the session's running turn.
    async with sessions() as db:
        running = await posting.post_user_message(
            db,
            owner=PRIYA,
            session_id=sid,
            client_message_id=uuid.uuid4().hex,
            text="Where is my order?",
            expected_last_seq=None,
            limits=LIFTED_LIMITS,
        )
        await db.commit()
    queued = await priya.post(sid, "Is anyone there?")
    assert queued.status_code == 202 and queued.json()["state"] == "queued"
    # It ends (stopped) with nobody listening for the outbox's bell.
    async with sessions() as db:
        await turns.end_unfinished_turn(db, turn_id=running.turn.id, state=TurnState.cancelled)
        await db.commit()
    workers.start()  # its sweep finds the promoted turn
    seen: list[Event] = []
    await follow(priya, queued.json()["events_url"], seen, timeout=60)
    assert seen[-1].type == "done" and _dense(seen)
    assert [e.data["state"] for e in seen if e.type == "state"][:2] == ["queued", "received"]
    messages = [m for m in await priya.messages(sid) if _said(m)]
    assert [m["role"] for m in messages] == ["user", "assistant", "user", "assistant"]
    assert [m["status"] for m in messages][:2] == ["complete", "cancelled"]
