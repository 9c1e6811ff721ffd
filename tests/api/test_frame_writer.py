"""A worker's streaming steps append their deltas through one writer: many turns' frames in
one commit with no NOTIFY, then one ring for the turns that moved; the log stays the truth,
so a ring that is lost costs a stream one poll, never an event."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

import psycopg
import pytest
from sqlalchemy import event as sql_events
from sse_starlette import ServerSentEvent

from parley.activities.frame_writer import FrameWriter
from parley.api.main import create_app
from parley.api.streaming import EventHub, turn_event_stream
from parley.config import Settings
from parley.contracts import EventType
from parley.store import events
from parley.store.db import Database, Db, libpq_url
from parley.store.events import append_events
from parley.store.identity import Identity
from parley.wire import DeltaData, ErrorData
from tests.support.stack import serve
from tests.support.toolkit import counted_sessions, eventually, post_unstarted

PRIYA = Identity(tenant_id="northwind", user_id="cust_2291", roles=())


async def _new_turn(db: Db) -> str:
    return (await post_unstarted(db, owner=PRIYA, text="Hello")).turn.id


@pytest.fixture
async def hub(database_url: str) -> AsyncIterator[EventHub]:
    hub = EventHub(libpq_url(database_url))
    await hub.start()
    await asyncio.wait_for(hub.listening.wait(), timeout=30)
    yield hub
    await hub.stop()


def _delta(text: str) -> DeltaData:
    return DeltaData(message_id="m", text=text)


async def _end(sessions: Database, turn_id: str) -> None:
    async with sessions() as db:
        error = ErrorData(code="model_unavailable", message="gone", retryable=True)
        await append_events(db, turn_id=turn_id, events=[(EventType.error, error)])
        await db.commit()


class Follower:
    """One live stream of a turn, its frames as they come."""

    def __init__(self, hub: EventHub, sessions: Database, turn_id: str) -> None:
        self.received: list[ServerSentEvent] = []
        self.task = asyncio.create_task(self._follow(hub, sessions, turn_id))

    async def _follow(self, hub: EventHub, sessions: Database, turn_id: str) -> None:
        async for event in turn_event_stream(hub=hub, sessions=sessions, turn_id=turn_id, after=0):
            self.received.append(event)

    def texts(self) -> list[str]:
        deltas = [e for e in self.received if e.event == "delta"]
        return [DeltaData.model_validate_json(str(e.data)).text for e in deltas]

    def ids(self) -> list[int]:
        return [int(e.id or 0) for e in self.received]


async def test_many_turns_deltas_commit_together_without_notify_and_reach_every_stream(
    sessions: Database, database_url: str, hub: EventHub, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("parley.api.streaming.LISTENING_POLL_S", 120.0)  # only rings wake
    async with sessions() as db:
        turns = [await _new_turn(db) for _ in range(3)]
        await db.commit()
    followers = [Follower(hub, sessions, t) for t in turns]

    async def all_reading() -> bool:  # each stream has read its log and waits on its bell
        return all(len(f.received) >= 1 for f in followers)

    await eventually(all_reading, timeout=30, what="each stream reads its log")
    # The writer's statements, counted on an engine of its own (the shared engine also
    # carries whatever a worker of this process still writes in the background).
    async with counted_sessions(database_url) as (writing, sent):
        writer = FrameWriter(writing)
        for word in ("one", "two", "three"):
            await asyncio.gather(*(writer.append(t, _delta(f"{word} {t}")) for t in turns))

        async def all_arrived() -> bool:
            return all(len(f.texts()) == 3 for f in followers)

        await eventually(all_arrived, timeout=30, what="every delta, rung")
    writes = [s for s in sent if "INSERT INTO turn_events" in s]
    # Three turns' frames in each commit, and none of those commits rings.
    assert len(writes) == 3
    assert not any("pg_notify" in s for s in writes)
    assert any("pg_notify" in s for s in sent)
    for follower, turn_id in zip(followers, turns, strict=True):
        await _end(sessions, turn_id)
        await asyncio.wait_for(follower.task, timeout=30)
        assert follower.texts() == [f"{w} {turn_id}" for w in ("one", "two", "three")]
        assert follower.ids() == list(range(1, 6))


async def test_a_lost_ring_costs_one_poll_never_an_event(
    sessions: Database, hub: EventHub, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("parley.api.streaming.LISTENING_POLL_S", 0.2)
    ring = events.ring_turns
    dropped: list[Sequence[str]] = []

    async def drop_the_last(conn: Db, lines: Sequence[str]) -> None:
        if any(":4:" in line for line in lines):
            dropped.append(lines)  # the worker died between the commit and the ring
            return
        await ring(conn, lines)

    monkeypatch.setattr(events, "ring_turns", drop_the_last)
    async with sessions() as db:
        turn_id = await _new_turn(db)
        await db.commit()
    follower = Follower(hub, sessions, turn_id)
    writer = FrameWriter(sessions)
    for text in ("a", "b", "c"):
        await writer.append(turn_id, _delta(text))

    async def all_three() -> bool:
        return follower.texts() == ["a", "b", "c"]

    # The third delta (event 4) rang nothing: the stream's poll of the log brings it.
    await eventually(all_three, timeout=30, what="the unrung delta, from the log")
    assert dropped
    await _end(sessions, turn_id)
    await asyncio.wait_for(follower.task, timeout=30)
    assert follower.ids() == list(range(1, 6))


async def test_a_frame_for_a_turn_that_does_not_exist_fails_alone(sessions: Database) -> None:
    async with sessions() as db:
        turn_id = await _new_turn(db)
        await db.commit()
    writer = FrameWriter(sessions)
    missing, found = await asyncio.gather(
        writer.append("trn_missing", _delta("x")),
        writer.append(turn_id, _delta("y")),
        return_exceptions=True,
    )
    assert isinstance(missing, LookupError)
    assert isinstance(found, events.Appended) and not found.stopped


async def test_the_api_listens_on_its_own_url_when_one_is_set(
    settings: Settings, database_url: str
) -> None:
    # Behind PgBouncer in transaction mode the listener must reach PostgreSQL itself.
    joiner = "&" if "?" in database_url else "?"
    listen = f"{database_url}{joiner}application_name=parley_listen"
    app = create_app(settings.model_copy(update={"listen_database_url": listen}))
    async with serve(app):
        hub: EventHub = app.state.hub
        await asyncio.wait_for(hub.listening.wait(), timeout=30)
        async with await psycopg.AsyncConnection.connect(
            libpq_url(database_url), autocommit=True
        ) as admin:
            cur = await admin.execute(
                "SELECT application_name, query FROM pg_stat_activity WHERE pid = %s",
                (hub.listener_pid,),
            )
            assert await cur.fetchone() == ("parley_listen", f"LISTEN {events.NOTIFY_CHANNEL}")


async def test_a_delta_leaves_the_indexed_updated_at_alone_until_it_is_old(
    sessions: Database, database_url: str
) -> None:
    async with sessions() as db:
        turn_id = await _new_turn(db)
        await db.commit()
    async with await psycopg.AsyncConnection.connect(
        libpq_url(database_url), autocommit=True
    ) as admin:

        async def touched() -> object:
            cur = await admin.execute("SELECT updated_at FROM turns WHERE id = %s", (turn_id,))
            return ((await cur.fetchone()) or (None,))[0]

        writer = FrameWriter(sessions)
        born = await touched()
        for text in ("a", "b", "c"):
            await writer.append(turn_id, _delta(text))
        assert await touched() == born  # no index entry per delta
        await admin.execute(
            "UPDATE turns SET updated_at = now() - interval '1 minute' WHERE id = %s", (turn_id,)
        )
        aged = await touched()
        await writer.append(turn_id, _delta("d"))
        assert await touched() > aged  # a streaming turn still looks alive to the sweep


async def test_a_busy_writer_spaces_its_flushes_on_one_connection(
    sessions: Database, database_url: str
) -> None:
    """Steps that keep streaming share commits when the writer spaces its flushes, and the
    writer keeps one connection while frames keep coming (no checkout a flush). The writer
    is on an engine of its own: the shared worker's checkouts are not this test's."""
    async with sessions() as db:
        turns = [await _new_turn(db) for _ in range(3)]
        await db.commit()
    checkouts: list[object] = []

    def checked_out(*args: object) -> None:
        checkouts.append(args)

    async with counted_sessions(database_url) as (own, sent):
        pool = own.engine.sync_engine.pool
        sql_events.listen(pool, "checkout", checked_out)
        try:
            writer = FrameWriter(own, spacing_s=lambda: 0.05)

            async def stream(turn_id: str) -> list[events.Appended]:
                return [await writer.append(turn_id, _delta(f"{i}")) for i in range(5)]

            written = await asyncio.gather(*(stream(t) for t in turns))
        finally:
            sql_events.remove(pool, "checkout", checked_out)
    for appended in written:
        assert [a.event_id for a in appended] == [2, 3, 4, 5, 6]  # each in order, once
    writes = [s for s in sent if "INSERT INTO turn_events" in s]
    assert len(writes) == 5  # one commit for the three streams' frames, each time
    assert len(checkouts) == 1
