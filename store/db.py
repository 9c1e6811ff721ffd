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

The worker's hot path, and the statements the API runs for every turn, speak one style:
`Conn`, psycopg's own connection taken from the same pool (`connect`, or `session_conn`
inside a session's transaction), statements written in psycopg's form (`%(name)s`) as named
functions in store/, rows returned as frozen dataclasses.
It keeps what the engine gives the ORM: the pool's checks, errors without parameters (a
psycopg error is raised as the `StoreError` SQLAlchemy would raise, `hide_parameters`), a
connection that broke mid-statement discarded, and every statement counted (`on_statement`).
"""

from __future__ import annotations

import select
import weakref
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any, TypeAlias, TypeVar, cast

import psycopg
from psycopg import pq
from psycopg.rows import BaseRowFactory, class_row, kwargs_row, tuple_row
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
    if autocommit:
        _AUTOCOMMIT_ENGINES.add(engine.sync_engine)
    return engine


# Engines made with `autocommit=True`. The mode is the dialect's, set once per connection,
# so it is not among the engine's execution options, where `autocommit_session_factory`
# would otherwise look for it (and switch every checkout again).
_AUTOCOMMIT_ENGINES: weakref.WeakSet[Any] = weakref.WeakSet()


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
    each way, which the API's hot path avoids with an engine of their own). That switch
    awaits the driver after the pool has handed the connection out and before the session
    holds it: a task cancelled there (a stream whose client left) dropped the connection
    unreturned, for the garbage collector to find."""
    if (
        engine.sync_engine in _AUTOCOMMIT_ENGINES
        or engine.get_execution_options().get("isolation_level") == "AUTOCOMMIT"
    ):
        return session_factory(engine)
    return session_factory(engine.execution_options(isolation_level="AUTOCOMMIT"))


async def autocommit(db: AsyncSession) -> AsyncConnection:
    """Run the rest of this session in autocommit mode, for work that is one statement (or
    only reads): no `BEGIN` and no `COMMIT`, two round trips fewer. Call it before the
    session's first statement; its connection goes back to the pool in the engine's own mode.
    Returns that connection, for statements that need no unit of work (Core)."""
    return await db.connection(execution_options={"isolation_level": "AUTOCOMMIT"})


async def ping(db: AsyncSession) -> None:
    """One round trip (`SELECT 1`); raises while the database is unreachable."""
    await db.execute(_PING)


_PING = text("SELECT 1")


def is_unreachable(exc: BaseException) -> bool:
    """Whether an error says the database could not be reached (or the connection was lost),
    as opposed to a statement the database refused."""
    if isinstance(exc, OperationalError | InterfaceError):
        return True
    # psycopg's own, raised where no statement was being run (a connect, a commit).
    if isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError):
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
    on_statement_sent(engine, lambda _sql: on_statement())
    event.listen(engine.sync_engine.pool, "checkout", lambda *_: on_checkout())


def on_statement_sent(engine: AsyncEngine, hook: Callable[[str], None]) -> Callable[[], None]:
    """Call `hook` with the text of every statement sent on the engine's connections, in
    either style: through SQLAlchemy, or on a `Conn` from its pool. Returns what stops it."""

    def sent(*args: Any) -> None:
        hook(str(args[2]))

    event.listen(engine.sync_engine, "before_cursor_execute", sent)
    hooks = _HOOKS.setdefault(engine.sync_engine.pool, [])
    hooks.append(hook)

    def stop() -> None:
        event.remove(engine.sync_engine, "before_cursor_execute", sent)
        hooks.remove(hook)

    return stop


# The statement hooks of each pool (a `Conn` is told them when it is taken from the pool).
_HOOKS: weakref.WeakKeyDictionary[Any, list[Callable[[str], None]]] = weakref.WeakKeyDictionary()

Row = TypeVar("Row")
Params: TypeAlias = Mapping[str, Any]


class Conn:
    """psycopg's connection for the statements of store/ (see the module's docstring)."""

    def __init__(
        self, driver: psycopg.AsyncConnection[Any], hooks: list[Callable[[str], None]]
    ) -> None:
        self._driver = driver
        self._hooks = hooks

    @property
    def database(self) -> str:
        """The database this connection reaches (its connection string, no password)."""
        return self._driver.info.dsn

    async def rows(self, sql: str, params: Params, row: type[Row]) -> list[Row]:
        """Every row the statement returns, as `row` (a dataclass: one field a column)."""
        cursor = await self._execute(sql, params, class_row(row))
        return await cursor.fetchall()

    async def row(self, sql: str, params: Params, row: type[Row]) -> Row | None:
        """The statement's first row as `row`, or None."""
        cursor = await self._execute(sql, params, class_row(row))
        return await cursor.fetchone()

    async def made(self, sql: str, params: Params, make: Callable[..., Row]) -> Row | None:
        """The first row, its columns given to `make` by name, or None."""
        cursor = await self._execute(sql, params, kwargs_row(make))
        return await cursor.fetchone()

    async def value(self, sql: str, params: Params) -> Any:
        """The first column of the first row (None when there is none)."""
        cursor = await self._execute(sql, params, tuple_row)
        found = await cursor.fetchone()
        return found[0] if found is not None else None

    async def run(self, sql: str, params: Params) -> int:
        """Run the statement; how many rows it changed."""
        cursor = await self._execute(sql, params, tuple_row)
        return cursor.rowcount

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[None]:
        """Statements that commit together (or not at all, when the block raises)."""
        try:
            async with self._driver.transaction():
                yield
        except psycopg.Error as exc:
            raise _store_error("COMMIT", exc) from exc

    async def _execute(
        self, sql: str, params: Params, rows: BaseRowFactory[Any]
    ) -> psycopg.AsyncCursor[Any]:
        for hook in self._hooks:
            hook(sql)
        cursor = self._driver.cursor(row_factory=rows)
        try:
            await cursor.execute(sql, params)
        except psycopg.Error as exc:
            raise _store_error(sql, exc) from exc
        return cursor


def _store_error(sql: str, exc: psycopg.Error) -> StoreError:
    """A psycopg error as SQLAlchemy raises it (`IntegrityError`, `OperationalError`, …),
    with the statement and never its parameters."""
    return DBAPIError.instance(sql, None, exc, psycopg.Error, hide_parameters=True)


@asynccontextmanager
async def connect(sessions: SessionMaker) -> AsyncIterator[Conn]:
    """A connection from the pool behind `sessions`, in autocommit mode: a statement commits
    by itself (no `BEGIN`, no `COMMIT`); `Conn.transaction` for several that commit
    together. Returned to the pool on leaving, in the mode it came in; thrown away instead
    when a statement was cut off mid-way (cancelled, or the connection broke)."""
    engine = sessions.kw["bind"]
    async with engine.connect() as connection:
        raw = await connection.get_raw_connection()
        driver = raw.driver_connection
        assert isinstance(driver, psycopg.AsyncConnection)
        was_autocommit = driver.autocommit
        if not was_autocommit:
            await driver.set_autocommit(True)
        try:
            yield Conn(driver, _HOOKS.get(engine.sync_engine.pool, []))
        finally:
            # Idle, unless a statement was cut off mid-way (cancelled) or the link broke.
            if driver.broken or driver.pgconn.transaction_status != pq.TransactionStatus.IDLE:
                await connection.invalidate()
            elif not was_autocommit:
                await driver.set_autocommit(False)


async def session_conn(db: AsyncSession) -> Conn:
    """The session's own connection as a `Conn`, inside the session's transaction (its
    pending changes written first): for a caller that also works through the session,
    while its statements move to `Conn`. The session's commit commits both.

    A POST asks for it once per statement, so the `Conn` is kept on the session for the
    transaction it was made in (a later transaction may hold another pooled connection), and
    the flush is skipped when nothing is pending: each is a trip through the session's
    machinery (and a greenlet) otherwise."""
    if db.new or db.dirty or db.deleted:
        await db.flush()
    transaction = db.sync_session.get_transaction()
    kept = db.info.get(_KEPT_CONN)
    if transaction is not None and kept is not None and kept[0] is transaction:
        return cast(Conn, kept[1])
    connection = await db.connection()
    raw = await connection.get_raw_connection()
    driver = raw.driver_connection
    assert isinstance(driver, psycopg.AsyncConnection)
    conn = Conn(driver, _HOOKS.get(connection.sync_engine.pool, []))
    # The transaction object itself, held: it cannot be mistaken for a later one.
    db.info[_KEPT_CONN] = (db.sync_session.get_transaction(), conn)
    return conn


_KEPT_CONN = "parley.session_conn"
