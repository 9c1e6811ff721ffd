"""Engines and connection strings.

SQLAlchemy wants `postgresql+psycopg://…`; psycopg's own LISTEN connection wants a plain
libpq URL. Both are derived from the one `DATABASE_URL`.

A pooled connection may have died while it sat in the pool (the server restarted). The
default check is SQLAlchemy's pre-ping: a `SELECT 1` (and its `BEGIN`) on every checkout.
`create_socket_checked_engine` checks without a round trip instead: an idle connection whose socket
has something to read was closed by the server (it says so before closing: a FATAL notice,
then end of file), so it is thrown away and a fresh one taken. A server that vanished
without a word (a cut network) is then found by the first statement, which fails, and
SQLAlchemy discards the whole pool; the API's hot path takes that trade.
"""

from __future__ import annotations

import re
import select
from collections.abc import Callable
from typing import Any, TypeAlias

import psycopg
from sqlalchemy import event, exc, text
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError, SQLAlchemyError
from sqlalchemy.ext.asyncio import (
    AsyncConnection,
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)

# The names callers outside store/ use: a unit of work (repository functions take it as
# `db`), the factory that opens one (`async with sessions() as db`), and an engine. Callers
# never import SQLAlchemy or psycopg themselves (tests/unit/test_layout.py).
Db: TypeAlias = AsyncSession
SessionMaker: TypeAlias = async_sessionmaker[AsyncSession]
Engine: TypeAlias = AsyncEngine
# psycopg's own connection under a SQLAlchemy one (`driver_connection`).
DriverConnection: TypeAlias = "psycopg.AsyncConnection[Any]"
# What a statement the database refused, or could not run, raises.
StoreError = SQLAlchemyError


def sqlalchemy_url(url: str) -> str:
    for prefix in ("postgresql+psycopg://", "postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    raise ValueError("DATABASE_URL must be a postgresql:// URL")


def libpq_url(url: str) -> str:
    return "postgresql://" + sqlalchemy_url(url).removeprefix("postgresql+psycopg://")


def create_engine(url: str, *, pool_size: int = 10, max_overflow: int = 20) -> AsyncEngine:
    return _engine(url, pool_size=pool_size, max_overflow=max_overflow, pre_ping=True)


def create_socket_checked_engine(
    url: str, *, pool_size: int = 10, max_overflow: int = 20, autocommit: bool = False
) -> AsyncEngine:
    """An engine whose pool checks a connection by its socket, not by a query (see above).
    With `autocommit`, its connections stay in autocommit mode for good (see
    `autocommit_session_factory`)."""
    engine = _engine(
        url,
        pool_size=pool_size,
        max_overflow=max_overflow,
        pre_ping=False,
        **({"isolation_level": "AUTOCOMMIT"} if autocommit else {}),
    )
    event.listen(engine.sync_engine.pool, "checkout", _refuse_closed)
    return engine


def _engine(
    url: str, *, pool_size: int, max_overflow: int, pre_ping: bool, **options: Any
) -> AsyncEngine:
    return create_async_engine(
        sqlalchemy_url(url),
        pool_size=pool_size,
        max_overflow=max_overflow,
        pool_pre_ping=pre_ping,
        # Errors must not carry statement parameters (message text, addresses) into logs or
        # into Temporal history as activity failures.
        hide_parameters=True,
        **options,
    )


def _refuse_closed(dbapi_connection: Any, _record: Any, _proxy: Any) -> None:
    """Pool checkout hook: a connection the server has closed is replaced (the pool retries
    the checkout on `DisconnectionError`)."""
    pgconn = dbapi_connection.driver_connection.pgconn
    if pgconn.status != 0:  # libpq's CONNECTION_OK
        raise exc.DisconnectionError("the connection is closed")
    # poll, not select: select cannot watch a descriptor numbered 1024 or above.
    waiting = select.poll()
    waiting.register(pgconn.socket, select.POLLIN)
    if waiting.poll(0):
        raise exc.DisconnectionError("the server closed the connection")


def session_factory(engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    return async_sessionmaker(engine, expire_on_commit=False)


def autocommit_session_factory(engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    """Sessions whose every statement commits by itself (no `BEGIN`, `COMMIT` is a no-op),
    for work that is one statement: two round trips fewer each. The caller still calls
    `commit()`, so the code reads the same and stays right if it ever runs in a
    transaction. An engine made with `autocommit=True` serves them as it is; any other is
    switched to autocommit on each checkout and back on each return (a few Python calls
    each way, which the API's hot path avoids with an engine of their own)."""
    if engine.get_execution_options().get("isolation_level") == "AUTOCOMMIT":
        return session_factory(engine)
    return session_factory(engine.execution_options(isolation_level="AUTOCOMMIT"))


async def autocommit(db: AsyncSession) -> AsyncConnection:
    """Run the rest of this session in autocommit mode, for work that is one statement (or
    only reads): no `BEGIN` and no `COMMIT`, two round trips fewer. Call it before the
    session's first statement; its connection goes back to the pool in the engine's own mode.
    Returns that connection, for statements that need no unit of work (Core)."""
    return await db.connection(execution_options={"isolation_level": "AUTOCOMMIT"})


async def driver_connection(connection: AsyncConnection) -> psycopg.AsyncConnection[Any]:
    """psycopg's own connection under a SQLAlchemy one, for a hot statement that skips
    SQLAlchemy's statement layer. It stays the SQLAlchemy connection's: returned to the pool
    with it, and in the same mode (call `autocommit` first for statements that commit alone)."""
    raw = await connection.get_raw_connection()
    driver = raw.driver_connection
    assert isinstance(driver, psycopg.AsyncConnection)
    return driver


def driver_sql(sql: str) -> str:
    """A statement written for SQLAlchemy's `text()` (`:name` placeholders) in psycopg's own
    form (`%(name)s`), for `driver_connection`. A name counts as `text()` counts it (not after
    a colon, a word character or a backslash, nor before a colon: `::` casts stay), and a
    literal `%` (a LIKE pattern) is doubled, as psycopg reads a lone one as a placeholder."""
    return _TEXT_BIND.sub(r"%(\1)s", sql.replace("%", "%%"))


# The pattern SQLAlchemy's `text()` finds its bind names with.
_TEXT_BIND = re.compile(r"(?<![:\w\\]):(\w+)(?!:)")


async def ping(db: AsyncSession) -> None:
    """One round trip (`SELECT 1`); raises while the database is unreachable."""
    await db.execute(_PING)


_PING = text("SELECT 1")


def is_unreachable(exc: BaseException) -> bool:
    """Whether an error says the database could not be reached (or the connection was lost),
    as opposed to a statement the database refused."""
    if isinstance(exc, OperationalError | InterfaceError):
        return True
    if isinstance(exc, DBAPIError) and exc.connection_invalidated:
        return True
    # A driver may raise the socket's own error when it cannot connect at all.
    return isinstance(exc, ConnectionError | FileNotFoundError)


def count_work(
    engine: AsyncEngine, *, on_statement: Callable[[], None], on_checkout: Callable[[], None]
) -> None:
    """Call `on_statement` for every statement the engine sends and `on_checkout` for every
    connection its pool hands out (the metrics the bench reports per turn)."""
    event.listen(engine.sync_engine, "before_cursor_execute", lambda *_: on_statement())
    event.listen(engine.sync_engine.pool, "checkout", lambda *_: on_checkout())
