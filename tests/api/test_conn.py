"""The hot path's access style (store/db.py `Conn`): psycopg's connection from the engine's
pool, rows as dataclasses, autocommit unless a transaction is asked for, errors as the
store raises them (without parameters), a connection the server dropped never reused, and
every statement counted."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
import pytest_asyncio
from sqlalchemy import text

from parley.store.db import (
    SessionMaker,
    StoreError,
    autocommit_session_factory,
    connect,
    create_socket_checked_engine,
    is_unreachable,
    on_statement_sent,
    ping,
    session_conn,
    session_factory,
)
from tests.support.orm import orm
from tests.support.toolkit import eventually

SECRET = "a-parameter-no-log-may-show"


@dataclass(frozen=True)
class Pair:
    word: str
    length: int


@pytest_asyncio.fixture
async def counted(database_url: str) -> AsyncIterator[tuple[SessionMaker, list[str]]]:
    """An engine of the test's own (pool of one: every `connect` takes the same connection
    back), each statement it sends recorded."""
    engine = create_socket_checked_engine(database_url, pool_size=1, max_overflow=0)
    sent: list[str] = []
    on_statement_sent(engine, sent.append)
    yield session_factory(engine), sent
    await engine.dispose()


async def test_rows_come_as_dataclasses_and_each_statement_is_counted(
    counted: tuple[SessionMaker, list[str]],
) -> None:
    sessions, sent = counted
    async with connect(sessions) as conn:
        rows = await conn.rows(
            "SELECT w AS word, length(w) AS length FROM unnest(%(words)s::text[]) AS w ORDER BY w",
            {"words": ["tea", "coffee"]},
            Pair,
        )
        assert rows == [Pair("coffee", 6), Pair("tea", 3)]
        assert await conn.row("SELECT 'x' AS word, 1 AS length WHERE false", {}, Pair) is None
        assert await conn.value("SELECT %(a)s::int + 1", {"a": 41}) == 42
    assert len(sent) == 3 and "unnest" in sent[0]
    # A statement sent through SQLAlchemy is counted by the same hook.
    async with sessions() as db:
        await ping(db)
    assert len(sent) == 4 and sent[-1] == "SELECT 1"


async def test_a_statement_commits_by_itself_and_a_transaction_all_or_nothing(
    counted: tuple[SessionMaker, list[str]], sessions: SessionMaker
) -> None:
    own, _ = counted
    table = "conn_probe"
    async with connect(own) as conn:
        await conn.run(f"CREATE TABLE IF NOT EXISTS {table} (v text)", {})
        await conn.run(f"DELETE FROM {table}", {})
        await conn.run(f"INSERT INTO {table} VALUES (%(v)s)", {"v": "alone"})
        with pytest.raises(RuntimeError):
            async with conn.transaction():
                await conn.run(f"INSERT INTO {table} VALUES (%(v)s)", {"v": "undone"})
                raise RuntimeError("the block fails")
        async with conn.transaction():
            await conn.run(f"INSERT INTO {table} VALUES (%(v)s)", {"v": "together"})
    # Another connection (another pool) sees what committed, and only that.
    async with connect(sessions) as other:
        seen = await other.value(f"SELECT array_agg(v ORDER BY v) FROM {table}", {})
        await other.run(f"DROP TABLE {table}", {})
    assert seen == ["alone", "together"]


async def test_a_sessions_conn_is_its_transactions_and_follows_it_to_the_next(
    counted: tuple[SessionMaker, list[str]],
) -> None:
    sessions, _ = counted
    xid = "SELECT txid_current()::text"
    async with sessions() as db:
        first = await session_conn(db)
        assert await first.value(xid, {}) == (await db.execute(text(xid))).scalar_one()
        assert await session_conn(db) is first  # kept for the transaction
        before = await first.value(xid, {})
        await db.commit()
        after = await session_conn(db)
        assert after is not first
        assert await after.value(xid, {}) == (await db.execute(text(xid))).scalar_one()
        assert await after.value(xid, {}) != before  # the next transaction, not the ended one
        await db.rollback()


async def test_an_error_is_the_stores_and_carries_no_parameters(
    counted: tuple[SessionMaker, list[str]],
) -> None:
    sessions, _ = counted
    async with connect(sessions) as conn:
        with pytest.raises(StoreError) as refused:
            await conn.value("SELECT 1 / 0 WHERE %(secret)s IS NOT NULL", {"secret": SECRET})
        assert SECRET not in str(refused.value)
        assert not is_unreachable(refused.value)
        # The connection is still good for the next statement.
        assert await conn.value("SELECT 1", {}) == 1


async def test_a_dropped_connection_is_unreachable_and_never_handed_out_again(
    counted: tuple[SessionMaker, list[str]], sessions: SessionMaker
) -> None:
    own, _ = counted
    async with connect(own) as conn:
        pid = await conn.value("SELECT pg_backend_pid()", {})
    # The server ends the pooled connection while it sits idle in the pool.
    await _terminate(sessions, pid)
    async with connect(own) as conn:
        # The pool's check found it closed and opened a fresh one.
        assert await conn.value("SELECT pg_backend_pid()", {}) != pid
        fresh = await conn.value("SELECT pg_backend_pid()", {})
        await _terminate(sessions, fresh)
        # Dropped while in use: the statement fails as an unreachable database does.
        with pytest.raises(StoreError) as lost:
            await conn.value("SELECT 1", {})
        assert is_unreachable(lost.value)
    async with connect(own) as conn:
        assert await conn.value("SELECT pg_backend_pid()", {}) not in (pid, fresh)


async def _terminate(sessions: SessionMaker, pid: int) -> None:
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


async def test_an_autocommit_engines_sessions_take_its_connections_as_they_are(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The API's stream reads: each statement its own transaction, and no switch of the
    connection's mode at checkout. That switch awaited the driver between the pool handing
    a connection out and the session holding it; a stream cancelled there (its client gone)
    left the connection unreturned, and the garbage collector warned of it later."""
    switched: list[bool] = []
    original = psycopg.AsyncConnection.set_autocommit

    async def set_autocommit(self: psycopg.AsyncConnection[Any], value: bool) -> None:
        switched.append(value)
        await original(self, value)

    monkeypatch.setattr(psycopg.AsyncConnection, "set_autocommit", set_autocommit)
    engine = create_socket_checked_engine(
        database_url, pool_size=1, max_overflow=0, autocommit=True
    )
    try:
        sessions = autocommit_session_factory(engine)
        for _ in range(3):
            async with orm(sessions) as db:
                first = (await db.execute(_XACT)).scalar_one()
                assert (await db.execute(_XACT)).scalar_one() != first
    finally:
        await engine.dispose()
    # Set once, when the pool opened its one connection; never at a checkout or a return.
    assert switched == [True]


_XACT = text("SELECT pg_current_xact_id()::text")
