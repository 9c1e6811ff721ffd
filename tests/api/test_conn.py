"""The store's one access style (store/db.py): a `Db` on psycopg's connection from the
engine's pool, rows as dataclasses, a unit of work that commits when its opener says so (or
each statement by itself, in autocommit), errors as the store raises them (without
parameters), a connection the server dropped or a statement cut off mid-way never reused, and
every statement counted."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
import pytest_asyncio
from sqlalchemy import event

from parley.store.db import (
    Database,
    StoreError,
    connect,
    create_socket_checked_engine,
    is_unreachable,
    on_statement_sent,
    ping,
)
from tests.support.toolkit import eventually

SECRET = "a-parameter-no-log-may-show"
PID = "SELECT pg_backend_pid()"


@dataclass(frozen=True)
class Pair:
    word: str
    length: int


@pytest_asyncio.fixture
async def counted(database_url: str) -> AsyncIterator[tuple[Database, list[str]]]:
    """An engine of the test's own (pool of one: every unit of work takes the same connection
    back), each statement it sends recorded."""
    engine = create_socket_checked_engine(database_url, pool_size=1, max_overflow=0)
    sent: list[str] = []
    on_statement_sent(engine, sent.append)
    yield Database(engine), sent
    await engine.dispose()


@pytest_asyncio.fixture
async def probe(sessions: Database) -> AsyncIterator[str]:
    """A table of the test's own."""
    table = f"conn_probe_{uuid.uuid4().hex[:8]}"
    async with connect(sessions) as db:
        await db.run(f"CREATE TABLE {table} (v text)", {})
    yield table
    async with connect(sessions) as db:
        await db.run(f"DROP TABLE {table}", {})


async def _stored(sessions: Database, table: str) -> list[str]:
    """What committed, seen from another connection."""
    async with connect(sessions) as other:
        return list(await other.values(f"SELECT v FROM {table} ORDER BY v", {}))


async def test_rows_come_as_dataclasses_and_each_statement_is_counted(
    counted: tuple[Database, list[str]],
) -> None:
    sessions, sent = counted
    async with connect(sessions) as db:
        rows = await db.rows(
            "SELECT w AS word, length(w) AS length FROM unnest(%(words)s::text[]) AS w ORDER BY w",
            {"words": ["tea", "coffee"]},
            Pair,
        )
        assert rows == [Pair("coffee", 6), Pair("tea", 3)]
        assert await db.row("SELECT 'x' AS word, 1 AS length WHERE false", {}, Pair) is None
        assert await db.value("SELECT %(a)s::int + 1", {"a": 41}) == 42
        assert await db.values("SELECT generate_series(1, 3)", {}) == [1, 2, 3]
    assert len(sent) == 4 and "unnest" in sent[0]
    # A unit of work's statements are counted by the same hook.
    async with sessions() as db:
        await ping(db)
    assert len(sent) == 5 and sent[-1] == "SELECT 1"


async def test_in_autocommit_a_statement_commits_by_itself_and_a_transaction_all_or_nothing(
    sessions: Database, probe: str
) -> None:
    async with connect(sessions) as db:
        await db.run(f"INSERT INTO {probe} VALUES (%(v)s)", {"v": "alone"})
        with pytest.raises(RuntimeError):
            async with db.transaction():
                await db.run(f"INSERT INTO {probe} VALUES (%(v)s)", {"v": "undone"})
                raise RuntimeError("the block fails")
        async with db.transaction():
            await db.run(f"INSERT INTO {probe} VALUES (%(v)s)", {"v": "together"})
        assert not db.in_transaction()
    assert await _stored(sessions, probe) == ["alone", "together"]


async def test_a_unit_of_work_keeps_only_what_its_opener_commits(
    sessions: Database, probe: str
) -> None:
    async with sessions() as db:
        await db.run(f"INSERT INTO {probe} VALUES ('kept')", {})
        assert db.in_transaction()
        assert await _stored(sessions, probe) == []  # not before the commit
        await db.commit()
        assert not db.in_transaction()
        await db.run(f"INSERT INTO {probe} VALUES ('rolled back')", {})
        await db.rollback()
        await db.run(f"INSERT INTO {probe} VALUES ('left uncommitted')", {})
    assert await _stored(sessions, probe) == ["kept"]

    async with sessions.begin() as db:
        await db.run(f"INSERT INTO {probe} VALUES ('begun')", {})
    with pytest.raises(RuntimeError):
        async with sessions.begin() as db:
            await db.run(f"INSERT INTO {probe} VALUES ('raised')", {})
            raise RuntimeError("the block fails")
    assert await _stored(sessions, probe) == ["begun", "kept"]


async def test_in_a_unit_of_work_a_transaction_is_a_savepoint_that_undoes_only_itself(
    sessions: Database, probe: str
) -> None:
    async with sessions() as db:
        await db.run(f"INSERT INTO {probe} VALUES ('before')", {})
        with pytest.raises(StoreError):
            async with db.transaction():
                await db.run(f"INSERT INTO {probe} VALUES ('collides')", {})
                await db.value("SELECT 1 / 0", {})
        async with db.transaction():
            await db.run(f"INSERT INTO {probe} VALUES ('inside')", {})
        # The unit of work goes on after the failed block, and nothing is committed yet.
        await db.run(f"INSERT INTO {probe} VALUES ('after')", {})
        assert await _stored(sessions, probe) == []
        await db.commit()
    assert await _stored(sessions, probe) == ["after", "before", "inside"]


async def test_an_error_is_the_stores_and_carries_no_parameters(
    counted: tuple[Database, list[str]],
) -> None:
    sessions, _ = counted
    async with connect(sessions) as db:
        with pytest.raises(StoreError) as refused:
            await db.value("SELECT 1 / 0 WHERE %(secret)s IS NOT NULL", {"secret": SECRET})
        assert SECRET not in str(refused.value)
        assert not is_unreachable(refused.value)
        # The connection is still good for the next statement.
        assert await db.value("SELECT 1", {}) == 1
    async with sessions() as db:
        with pytest.raises(StoreError):
            await db.value("SELECT 1 / 0", {})
        await db.rollback()
        assert await db.value("SELECT 1", {}) == 1


async def test_a_statement_cut_by_its_timeout_is_refused_not_an_outage(
    counted: tuple[Database, list[str]],
) -> None:
    """psycopg calls a statement timeout (and a deadlock) "operational", but the database
    answered: the API must say 500, not 503 with "database unavailable" and a Retry-After."""
    sessions, _ = counted
    async with sessions() as db:
        await db.run("SET LOCAL statement_timeout = '20ms'", {})
        with pytest.raises(StoreError) as cut:
            await db.value("SELECT pg_sleep(5)", {})
        assert not is_unreachable(cut.value)
        await db.rollback()
        assert await db.value("SELECT 1", {}) == 1


async def test_a_dropped_connection_is_unreachable_and_never_handed_out_again(
    counted: tuple[Database, list[str]], sessions: Database
) -> None:
    own, _ = counted
    async with connect(own) as db:
        pid = await db.value(PID, {})
    # The server ends the pooled connection while it sits idle in the pool.
    await _terminate(sessions, pid)
    async with own() as db:
        # The pool's check found it closed and opened a fresh one.
        fresh = await db.value(PID, {})
        assert fresh != pid
        await _terminate(sessions, fresh)
        # Dropped while in use: the statement fails as an unreachable database does.
        with pytest.raises(StoreError) as lost:
            await db.value("SELECT 1", {})
        assert is_unreachable(lost.value)
    async with connect(own) as db:
        assert await db.value(PID, {}) not in (pid, fresh)


async def test_a_unit_of_work_whose_connection_broke_keeps_failing_as_unreachable(
    counted: tuple[Database, list[str]], sessions: Database
) -> None:
    """The API answers a `StoreError` that says unreachable with 503; anything else is a 500.
    A route that goes on after a failed statement (a collision it handles, say) must meet the
    store's error again, not psycopg's "the connection is closed" (found by the chaos soak,
    bench/chaos.py: a POST answered 500 as PostgreSQL was killed)."""
    own, _ = counted
    async with own() as db:
        await _terminate(sessions, await db.value(PID, {}))
        with pytest.raises(StoreError):
            await db.value("SELECT 1", {})
        with pytest.raises(StoreError) as again:
            await db.value("SELECT 1", {})
        assert is_unreachable(again.value)


async def test_a_statement_cut_off_mid_way_stops_on_the_server_and_spoils_nothing(
    counted: tuple[Database, list[str]], sessions: Database
) -> None:
    """A stream whose client left cancels its statement: the statement stops on the server
    (it does not hold a backend for its remaining 30 s), the unit of work's transaction goes,
    and the next caller of the pool gets a working connection."""
    own, _ = counted
    started = asyncio.Event()
    pids: list[int] = []

    async def sleeps() -> None:
        async with own() as db:
            pids.append(await db.value(PID, {}))
            started.set()
            await db.value("SELECT pg_sleep(30)", {})

    task = asyncio.create_task(sleeps())
    await started.wait()

    async def sleeping(pid: int) -> int:
        async with connect(sessions) as other:
            return int(
                await other.value(
                    "SELECT count(*) FROM pg_stat_activity WHERE pid = %(pid)s"
                    " AND state = 'active' AND query LIKE 'SELECT pg_sleep%%'",
                    {"pid": pid},
                )
            )

    await eventually(lambda: sleeping(pids[0]), timeout=10, what="the statement running")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task

    async def stopped() -> bool:
        return await sleeping(pids[0]) == 0

    await eventually(stopped, timeout=10, what="the cut-off statement stopped on the server")
    async with own() as db:
        assert await db.value("SELECT 1", {}) == 1
        await db.commit()


async def test_close_gives_the_connection_back_and_what_was_uncommitted_goes(
    counted: tuple[Database, list[str]], sessions: Database, probe: str
) -> None:
    own, _ = counted
    async with own() as db:
        await db.run(f"INSERT INTO {probe} VALUES ('uncommitted')", {})
        await db.close()
        # The pool of one has its connection back: another unit of work takes it.
        async with connect(own) as other:
            assert await other.value("SELECT 1", {}) == 1
        # The closed one takes a connection again at its next statement.
        assert await db.value(f"SELECT count(*) FROM {probe}", {}) == 0


async def _terminate(sessions: Database, pid: int) -> None:
    """End backend `pid` and wait until it is gone. `pg_terminate_backend` only signals
    it; the backend writes its FATAL notice to the socket, then leaves `pg_stat_activity`.
    Until then the pool's socket check (and a statement) could still find it alive."""
    async with connect(sessions) as other:
        assert await other.value("SELECT pg_terminate_backend(%(pid)s)", {"pid": pid})

        async def gone() -> bool:
            return not await other.value(
                "SELECT count(*) FROM pg_stat_activity WHERE pid = %(pid)s", {"pid": pid}
            )

        await eventually(gone, timeout=10, what=f"backend {pid} gone", every=0.01)


async def test_an_autocommit_engines_units_of_work_take_its_connections_as_they_are(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The API's stream reads: each statement its own transaction, and no switch of the
    connection's mode at checkout. That switch awaited the driver between the pool handing
    a connection out and the unit of work holding it; a stream cancelled there (its client
    gone) left the connection unreturned, and the garbage collector warned of it later."""
    # The patch is the class's, so it sees every connection of this process: with the
    # session's one event loop, another engine's work may switch its own meanwhile. Only this
    # engine's connections (named by the pool as it opens them) are counted.
    calls: list[tuple[psycopg.AsyncConnection[Any], bool]] = []
    original = psycopg.AsyncConnection.set_autocommit

    async def set_autocommit(self: psycopg.AsyncConnection[Any], value: bool) -> None:
        calls.append((self, value))
        await original(self, value)

    monkeypatch.setattr(psycopg.AsyncConnection, "set_autocommit", set_autocommit)
    engine = create_socket_checked_engine(
        database_url, pool_size=1, max_overflow=0, autocommit=True
    )
    ours: list[psycopg.AsyncConnection[Any]] = []
    event.listen(
        engine.sync_engine, "connect", lambda dbapi, _: ours.append(dbapi.driver_connection)
    )
    try:
        sessions = Database(engine, autocommit=True)
        for _ in range(3):
            async with sessions() as db:
                first = await db.value(_XACT, {})
                assert await db.value(_XACT, {}) != first
                await db.commit()
    finally:
        await engine.dispose()
    # Set once, when the pool opened its one connection; never at a checkout or a return.
    assert len(ours) == 1
    assert [value for made, value in calls if made is ours[0]] == [True]


_XACT = "SELECT pg_current_xact_id()::text"


# Whether this very statement runs prepared: psycopg prepares it under a name of its own, and
# PostgreSQL lists the connection's prepared statements with their text.
PREPARED = """
    SELECT count(*) > 0 FROM pg_prepared_statements WHERE strpos(statement, %(me)s) > 0
"""


async def test_after_a_burst_units_of_work_share_a_connection_that_prepares_statements(
    database_url: str,
) -> None:
    """Planning the hot path's big statements costs PostgreSQL more than running them: a
    statement is prepared on its connection at its second run there, and after a burst of
    concurrent work (which opens many connections) the next units of work, one at a time,
    take the connection given back last, so their statements run prepared. Handed out in
    turn, each would have run once on every connection of the burst first."""
    burst = 8
    engine = create_socket_checked_engine(database_url, pool_size=burst, max_overflow=0)
    sessions = Database(engine)
    holding, all_held = 0, asyncio.Event()

    async def busy() -> int:
        nonlocal holding
        async with connect(sessions) as db:
            pid = int(await db.value(PID, {}))
            holding += 1
            if holding == burst:
                all_held.set()
            await all_held.wait()  # every connection of the pool held at once
            return pid

    try:
        assert len(set(await asyncio.gather(*(busy() for _ in range(burst))))) == burst
        pids, prepared = set(), []
        for _ in range(4):
            async with connect(sessions) as db:
                pids.add(await db.value(PID, {}))
                prepared.append(await db.value(PREPARED, {"me": "pg_prepared_statements WHERE"}))
        assert len(pids) == 1, pids
        # Not prepared at its first run on the connection; prepared from its second on.
        assert prepared == [False, True, True, True]
    finally:
        await engine.dispose()


@pytest.mark.parametrize(("asked", "idle"), [(None, "60"), ("keepalives_idle=5", "5")])
async def test_pooled_connections_send_keepalives_unless_the_url_sets_its_own(
    database_url: str, asked: str | None, idle: str
) -> None:
    """The pool hands out the connection given back last, so the ones at its bottom may sit
    idle for long: after a minute of silence TCP keepalives probe them, so one a network cut
    dropped without a word is found (and thrown away at checkout) rather than a statement
    hanging on it. A URL that sets its own is kept."""
    url = (
        database_url
        if asked is None
        else f"{database_url}{'&' if '?' in database_url else '?'}{asked}"
    )
    engine = create_socket_checked_engine(url, pool_size=1, max_overflow=0)
    try:
        async with engine.connect() as connection:
            raw = await connection.get_raw_connection()
            parameters = raw.driver_connection.info.get_parameters()
        assert parameters.get("keepalives_idle") == idle, parameters
    finally:
        await engine.dispose()
