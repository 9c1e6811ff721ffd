"""Live streams take the events the NOTIFY doorbell brings, and go back to the log whenever
the doorbell cannot be trusted to have brought everything (a gap, a batch too large to ring
with, a ring without events)."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import psycopg
import pytest
from sse_starlette import ServerSentEvent
from sse_starlette.sse import SendTimeoutError

from parley.api.sse import TurnEventResponse
from parley.api.streaming import Doorbell, EventHub, turn_event_stream
from parley.contracts import EventType
from parley.store.db import Database, Db, libpq_url, on_statement_sent
from parley.store.events import (
    NOTIFY_CHANNEL,
    NOTIFY_EVENTS_MAX,
    StoredEvent,
    append_events,
    parse_notification,
)
from parley.store.identity import Identity
from parley.wire import DeltaData, ErrorData
from tests.support.toolkit import eventually, post_unstarted

PRIYA = Identity(tenant_id="northwind", user_id="cust_2291", roles=())


def _events(*ids: int) -> list[StoredEvent]:
    return [StoredEvent(id=i, type="delta", data={"message_id": "m", "text": str(i)}) for i in ids]


def test_the_doorbell_hands_over_only_what_follows_without_a_gap() -> None:
    bell = Doorbell()
    assert bell.take(0) == []  # nothing brought, nothing to read
    bell.ring(_events(1, 2))
    bell.ring(_events(3))
    assert [e.id for e in bell.take(0) or []] == [1, 2, 3]
    bell.ring(_events(2, 3, 4))  # already sent up to 3: only 4 is new
    assert [e.id for e in bell.take(3) or []] == [4]
    bell.ring(_events(6))  # 5 never came: the log must be read
    assert bell.take(4) is None
    bell.ring([])  # a ring without events (too large, or a listener reconnect)
    bell.ring(_events(5))
    assert bell.take(4) is None


def test_a_notification_names_its_turn_and_carries_its_events() -> None:
    assert parse_notification('turn_1:7:[{"type":"delta","data":{"text":"a"}}]') == (
        "turn_1",
        [StoredEvent(id=7, type="delta", data={"text": "a"})],
    )
    assert parse_notification("turn_1:7:") == ("turn_1", [])  # did not fit
    assert parse_notification("turn_1:7") == ("turn_1", [])  # a worker of the older release


class LogReads:
    """How often a stream read the log: the reads sent on the engine behind `sessions`."""

    def __init__(self, sessions: Database) -> None:
        self.opened = 0
        self.stop = on_statement_sent(sessions.engine, self._sent)

    def _sent(self, statement: str) -> None:
        if "FROM turn_events" in statement and "LEFT JOIN LATERAL" in statement:
            self.opened += 1


@pytest.fixture
def log_reads(sessions: Database) -> Iterator[LogReads]:
    reads = LogReads(sessions)
    yield reads
    reads.stop()


async def _new_turn(db: Db) -> str:
    # No workflow runs this turn: it is the test's alone.
    return (await post_unstarted(db, owner=PRIYA, text="Hello")).turn.id


@pytest.fixture
async def hub(database_url: str) -> AsyncIterator[EventHub]:
    hub = EventHub(libpq_url(database_url))
    await hub.start()
    await asyncio.wait_for(hub.listening.wait(), timeout=30)
    yield hub
    await hub.stop()


async def test_a_live_stream_sends_every_event_in_order_with_or_without_the_doorbell(
    sessions: Database,
    hub: EventHub,
    monkeypatch: pytest.MonkeyPatch,
    log_reads: LogReads,
) -> None:
    # No poll rescues a stream here: what it sends came by the doorbell or by a read it chose.
    monkeypatch.setattr("parley.api.streaming.POLL_INTERVAL_S", 120.0)
    async with sessions() as db:
        turn_id = await _new_turn(db)
    counting = log_reads
    received: list[ServerSentEvent] = []
    seen = asyncio.Condition()

    async def follow() -> None:
        stream = turn_event_stream(hub=hub, sessions=sessions, turn_id=turn_id, after=0)
        async for event in stream:
            async with seen:
                received.append(event)
                seen.notify_all()

    async def append(*texts: str) -> None:
        async with sessions() as db:
            await append_events(
                db,
                turn_id=turn_id,
                events=[(EventType.delta, DeltaData(message_id="m", text=t)) for t in texts],
            )
            await db.commit()

    async def until(count: int) -> None:
        async with seen:
            await asyncio.wait_for(seen.wait_for(lambda: len(received) >= count), timeout=30)

    follower = asyncio.create_task(follow())

    async def settled() -> bool:  # subscribed, then read the log and the turn's end at once
        return counting.opened >= 1

    await eventually(settled, timeout=30, what="the stream waits on its doorbell")
    opened_before = counting.opened
    small = [f"small {i}" for i in range(10)]
    for count, text in enumerate(["one", *small], start=1):  # each rings with its event
        await append(text)
        await until(count)
    assert counting.opened == opened_before
    large = "x" * (NOTIFY_EVENTS_MAX + 100)  # too large to ring with: the log is read
    await append(large, "after the large one")
    await append("last")
    async with sessions() as db:
        error = ErrorData(code="model_unavailable", message="gone", retryable=True)
        await append_events(db, turn_id=turn_id, events=[(EventType.error, error)])
        await db.commit()
    await asyncio.wait_for(follower, timeout=30)

    ids = [int(e.id or 0) for e in received]
    assert ids == list(range(1, len(ids) + 1))
    texts = [e.data for e in received if e.event == "delta"]
    expected = ["one", *small, large, "after the large one", "last"]
    assert [DeltaData.model_validate_json(t).text for t in texts] == expected
    assert received[-1].event == "error"
    assert counting.opened > opened_before  # the large batch came from the log


async def test_a_quiet_stream_polls_the_log_only_while_the_listener_is_down(
    sessions: Database,
    hub: EventHub,
    monkeypatch: pytest.MonkeyPatch,
    log_reads: LogReads,
) -> None:
    monkeypatch.setattr("parley.api.streaming.POLL_INTERVAL_S", 0.05)
    monkeypatch.setattr("parley.api.streaming.LISTENING_POLL_S", 120.0)
    async with sessions() as db:
        turn_id = await _new_turn(db)
    counting = log_reads
    received: list[ServerSentEvent] = []

    async def follow() -> None:
        stream = turn_event_stream(hub=hub, sessions=sessions, turn_id=turn_id, after=0)
        async for event in stream:
            received.append(event)

    follower = asyncio.create_task(follow())
    try:

        async def first_read() -> bool:
            return counting.opened >= 1 and len(received) >= 1  # `received`, from the log

        await eventually(first_read, timeout=30, what="the stream reads the log once")
        # Listening: a quiet turn costs no reads (ten poll intervals of the listener-down kind).
        await asyncio.sleep(0.5)
        assert counting.opened == 1
        hub.listening.clear()  # as while the listener reconnects: notifications may be lost
        async with sessions() as db:
            await append_events(
                db, turn_id=turn_id, events=[(EventType.delta, DeltaData(message_id="m", text="a"))]
            )
            await db.commit()

        async def polling() -> bool:
            return counting.opened >= 4

        await eventually(polling, timeout=30, what="the stream polls the log again")
        assert [e.event for e in received] == ["state", "delta"]
    finally:
        hub.listening.set()
        follower.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await follower


async def test_the_listener_comes_back_after_its_connection_is_killed_and_rings_again(
    database_url: str, hub: EventHub
) -> None:
    # Other hubs of this process (an app another test started) listen on the same database:
    # the hub names its own connection, so the test kills that one and no other.
    async with await psycopg.AsyncConnection.connect(
        libpq_url(database_url), autocommit=True
    ) as admin:
        first = hub.listener_pid
        assert first is not None
        await admin.execute("SELECT pg_terminate_backend(%s)", (first,))

        async def listening_again() -> int | None:
            pid = hub.listener_pid
            return pid if pid not in (None, first) and hub.listening.is_set() else None

        again = await eventually(listening_again, timeout=30, what="a new LISTEN connection")
        cur = await admin.execute("SELECT query FROM pg_stat_activity WHERE pid = %s", (again,))
        assert await cur.fetchone() == (f"LISTEN {NOTIFY_CHANNEL}",)
        turn_id = f"trn_{uuid.uuid4().hex[:20]}"
        with hub.subscribe(turn_id) as doorbell:
            note = f'{turn_id}:1:[{{"type":"delta","data":{{"text":"back"}}}}]'
            await admin.execute("SELECT pg_notify(%s, %s)", (NOTIFY_CHANNEL, note))
            await asyncio.wait_for(doorbell.wait(), timeout=30)
            brought = doorbell.take(0)
        assert brought == [StoredEvent(id=1, type="delta", data={"text": "back"})]


async def test_a_frame_the_client_never_takes_ends_its_stream_at_the_send_timeout() -> None:
    closed = asyncio.Event()

    async def frames() -> AsyncIterator[bytes]:
        try:
            while True:
                yield b"data: x\n\n"
        finally:
            closed.set()

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body":
            await asyncio.Event().wait()  # a reader that stopped reading

    async def receive() -> dict[str, Any]:
        await asyncio.Event().wait()
        return {"type": "http.disconnect"}

    response = TurnEventResponse(frames(), ping=600, send_timeout=0.05)
    scope = {"type": "http", "method": "GET", "path": "/", "headers": []}
    with pytest.raises(SendTimeoutError):
        await asyncio.wait_for(response(scope, receive, send), timeout=30)
    assert closed.is_set()  # the stream's own cleanup ran
