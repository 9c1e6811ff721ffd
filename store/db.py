"""Engines, units of work and the one way statements are sent.

SQLAlchemy's engine is the pool (and alembic's, for migrations); its URL and psycopg's own
come from the one `DATABASE_URL` (store/postgres.py, with every connection's options).

Every statement of store/ goes the same way: through a `Db`, on psycopg's own connection taken
from that pool, written in psycopg's form (`%(name)s`) as a named statement of the module
that owns it, its rows returned as frozen dataclasses. A `Db` keeps what the pool gives: its
checks, errors without parameters (a psycopg error is raised as the `StoreError` SQLAlchemy
would raise, with `hide_parameters`), a connection that broke mid-statement discarded, and
every statement counted (`on_statement_sent`). Statements that do not wait on each other's
answers can go in one round trip (`Db.together`, psycopg's pipeline mode): a hot path that
needs several owners' statements sends them at once and reads their results after.

The transaction rule, written here once. A `Db` from `database()` is a unit of work: its
first statement begins a transaction, which its opener commits (`await db.commit()`, or
`database.begin()`, which commits on leaving unless the block raised); repository functions
never commit or roll back. A `Db` from `database.connect()`, or from a `Database` made with
`autocommit=True`, commits each statement by itself: no `BEGIN` and no `COMMIT`, two round
trips fewer, for work that is one statement or only reads. In either mode,
`db.transaction()` groups statements that stand or fall together (in a unit of work, a
savepoint: a collision with a duplicate undoes only itself).

A pooled connection may have died while it sat in the pool (the server restarted). The
default check is SQLAlchemy's pre-ping: a `SELECT 1` (and its `BEGIN`) on every checkout.
`create_socket_checked_engine` checks without a round trip instead: an idle connection whose
socket has something to read was closed by the server (it says so before closing: a FATAL
notice, then end of file), so it is thrown away and a fresh one taken. A server that vanished
without a word (a cut network) is then found by the first statement, which fails, and that
connection is discarded; the API's hot path takes that trade.
"""

from __future__ import annotations

import contextlib
import select
import weakref
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, Generic, TypeAlias, TypeVar

import psycopg
from psycopg import pq
from psycopg.rows import BaseRowFactory, class_row, kwargs_row, tuple_row
from sqlalchemy import event, exc, make_url
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError, SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from parley.store.postgres import CONNECTION_OPTIONS
from parley.store.postgres import libpq_url as libpq_url
from parley.store.postgres import sqlalchemy_url as sqlalchemy_url

# What callers outside store/ name: a unit of work (repository functions take it as `db`),
# where units of work come from (`Database`, below), and an engine. Callers never import
# SQLAlchemy or psycopg themselves (tests/unit/test_layout.py).
Engine: TypeAlias = AsyncEngine
# What a statement the database refused, or could not run, raises.
StoreError = SQLAlchemyError


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
    given = make_url(sqlalchemy_url(url)).query  # options the URL sets itself stay its own
    return create_async_engine(
        sqlalchemy_url(url),
        pool_size=pool_size,
        max_overflow=max_overflow,
        pool_pre_ping=pre_ping,
        pool_use_lifo=True,  # the connection given back last: store/postgres.py
        connect_args={k: v for k, v in CONNECTION_OPTIONS.items() if k not in given},
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


# SQLSTATEs by which a server that answered says it cannot serve the connection: class 08
# (connection exception), shutting down, crashed, starting up, and no connection slot left.
# Any other code is a statement it refused (a statement timeout, a deadlock, a lock wait): the
# database is there, so that is not an outage, even where psycopg names it "operational".
_SERVER_AWAY = ("08", "57P01", "57P02", "57P03", "53300")


def is_unreachable(exc: BaseException) -> bool:
    """Whether an error says the database could not be reached (or the connection was lost),
    as opposed to a statement the database refused."""
    cause = getattr(exc, "orig", None) or exc
    sqlstate = cause.sqlstate if isinstance(cause, psycopg.Error) else None
    if sqlstate is not None:
        return sqlstate.startswith(_SERVER_AWAY)
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
    """Call `hook` with the text of every statement a `Db` sends on the engine's
    connections (the statements of a `Db.together` block as one: one round trip). Returns
    what stops it."""
    hooks = _HOOKS.setdefault(engine.sync_engine.pool, [])
    hooks.append(hook)
    return lambda: hooks.remove(hook)


def on_transaction_sent(engine: AsyncEngine, hook: Callable[[str], None]) -> Callable[[], None]:
    """Call `hook` with each `BEGIN`, `COMMIT` or `ROLLBACK` a unit of work sends on the
    engine's connections (psycopg's own round trips, unseen by statement hooks); its stop."""
    hooks = _TX_HOOKS.setdefault(engine.sync_engine.pool, [])
    hooks.append(hook)
    return lambda: hooks.remove(hook)


# The statement and transaction hooks of each pool (a `Db` is told them when it takes one).
_HOOKS: weakref.WeakKeyDictionary[Any, list[Callable[[str], None]]] = weakref.WeakKeyDictionary()
_TX_HOOKS: weakref.WeakKeyDictionary[Any, list[Callable[[str], None]]] = weakref.WeakKeyDictionary()

Row = TypeVar("Row")
Params: TypeAlias = Mapping[str, Any]


class Db:
    """A unit of work: statements on one connection from the pool, taken at the first
    statement and given back on leaving (see the module's docstring for the two modes).

    In a unit of work, the first statement begins a transaction, `commit` ends it and the
    next statement begins another; leaving without a commit rolls back what was not
    committed. On a connection in autocommit (`Database.connect`, or a `Database` made with
    `autocommit=True`), each statement commits by itself and `commit` has nothing to do."""

    def __init__(self, database: Database, *, autocommit: bool) -> None:
        self._database = database
        self._autocommit = autocommit
        self._taken: _Taken | None = None
        self._savepoints = 0
        # The statements `together` has queued, not yet sent (None: outside such a block).
        self._queued: list[str] | None = None

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

    async def values(self, sql: str, params: Params) -> list[Any]:
        """The first column of every row."""
        cursor = await self._execute(sql, params, tuple_row)
        return [found[0] for found in await cursor.fetchall()]

    async def run(self, sql: str, params: Params) -> int:
        """Run the statement; how many rows it changed."""
        cursor = await self._execute(sql, params, tuple_row)
        return cursor.rowcount

    async def send(self, sql: str, params: Params, row: type[Row]) -> Sent[Row]:
        """Send the statement, or queue it in a `together` block; its rows as `row`, read
        through what this returns (after the block)."""
        return Sent(await self._execute(sql, params, class_row(row)), sql)

    async def send_made(self, sql: str, params: Params, make: Callable[..., Row]) -> Sent[Row]:
        """`send`, each row's columns given to `make` by name."""
        return Sent(await self._execute(sql, params, kwargs_row(make)), sql)

    @asynccontextmanager
    async def together(self) -> AsyncIterator[None]:
        """Statements `send` queues in this block reach the server together when it ends: one
        round trip for all of them (and for the `BEGIN` of a unit of work that starts with
        them), run in order. Read each one's result through what `send` returned, after the
        block. A statement the server refuses raises on leaving, and those queued after it did
        not run. The statement hooks see the block's statements as one (one round trip)."""
        taken = await self._take()
        assert self._queued is None, "one `together` block at a time"
        self._queued = []
        try:
            async with taken.driver.pipeline():
                yield
        except psycopg.Error as exc:
            raise _store_error(" ; ".join(self._queued), exc) from exc
        finally:
            queued, self._queued = self._queued, None
            if queued:
                for hook in taken.hooks:
                    hook(" ; ".join(q.strip() for q in queued))

    @property
    def database(self) -> str:
        """The database this unit of work reaches (its connection string, no password)."""
        return self._database.address

    def in_transaction(self) -> bool:
        """Whether statements have run since the last commit (or rollback) that a commit
        would make permanent."""
        return self._taken is not None and self._taken.driver.pgconn.transaction_status in (
            pq.TransactionStatus.INTRANS,
            pq.TransactionStatus.INERROR,
        )

    async def repeatable_read(self) -> None:
        """Read the rest of this unit of work from one snapshot (`REPEATABLE READ`): an
        export sees every table as of one moment. Call it before the first statement."""
        await self.run("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ", {})

    async def commit(self) -> None:
        """Make the unit of work's statements permanent."""
        if self._taken is not None and not self._taken.driver.autocommit:
            self._taken.tell("COMMIT")
            try:
                await self._taken.driver.commit()
            except psycopg.Error as exc:
                raise _store_error("COMMIT", exc) from exc

    async def rollback(self) -> None:
        """Undo every statement since the last commit."""
        if self._taken is not None and not self._taken.driver.autocommit:
            self._taken.tell("ROLLBACK")
            try:
                await self._taken.driver.rollback()
            except psycopg.Error as exc:
                raise _store_error("ROLLBACK", exc) from exc

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[None]:
        """Statements that stand or fall together: undone, and only they, when the block
        raises (a collision with a duplicate, say). In autocommit they are a transaction of
        their own, committed on leaving the block; in a unit of work they are a savepoint in
        its transaction, which its commit makes permanent."""
        driver = (await self._take()).driver
        if driver.autocommit:
            try:
                async with driver.transaction():
                    yield
            except psycopg.Error as exc:
                raise _store_error("COMMIT", exc) from exc
            return
        self._savepoints += 1
        name = f"parley_{self._savepoints}"
        await self.run(f"SAVEPOINT {name}", {})
        try:
            yield
        except BaseException:
            # Only a connection between statements can take it (one cut off mid-statement is
            # thrown away on leaving); the block's own exception is what the caller sees.
            if not driver.broken and driver.pgconn.transaction_status in _BETWEEN_STATEMENTS:
                with contextlib.suppress(StoreError):
                    await self.run(f"ROLLBACK TO SAVEPOINT {name}", {})
            raise
        await self.run(f"RELEASE SAVEPOINT {name}", {})

    async def close(self) -> None:
        """Give the connection back to the pool now, rolling back what was not committed (a
        caller that goes on for minutes without statements does not hold one)."""
        taken, self._taken = self._taken, None
        if taken is not None:
            await taken.give_back()

    async def _take(self) -> _Taken:
        if self._taken is None:
            self._taken = await _Taken.take(self._database, autocommit=self._autocommit)
        return self._taken

    async def _execute(
        self, sql: str, params: Params, rows: BaseRowFactory[Any]
    ) -> psycopg.AsyncCursor[Any]:
        taken = await self._take()
        taken.tell("BEGIN")  # psycopg's own, before the statement, in a unit of work
        if self._queued is not None:
            self._queued.append(sql)  # the hooks hear of it when the block sends it
        else:
            for hook in taken.hooks:
                hook(sql)
        try:
            # A connection that broke under an earlier statement of this unit of work
            # refuses even the cursor: that too is the store's error, an unreachable one.
            cursor = taken.driver.cursor(row_factory=rows)
            await cursor.execute(sql, params)
        except psycopg.Error as exc:
            raise _store_error(sql, exc) from exc
        return cursor


class Sent(Generic[Row]):
    """A statement sent by `Db.send` (or queued in `Db.together`): its result, once there."""

    def __init__(self, cursor: psycopg.AsyncCursor[Row], sql: str) -> None:
        self._cursor = cursor
        self._sql = sql

    async def row(self) -> Row | None:
        """The statement's first row, or None."""
        try:
            return await self._cursor.fetchone()
        except psycopg.Error as exc:
            raise _store_error(self._sql, exc) from exc

    async def rows(self) -> list[Row]:
        """Every row the statement returned."""
        try:
            return await self._cursor.fetchall()
        except psycopg.Error as exc:
            raise _store_error(self._sql, exc) from exc


class _Taken:
    """A connection checked out of the engine's pool for one `Db`, with the mode it came in."""

    def __init__(
        self, connection: AsyncConnection, driver: psycopg.AsyncConnection[Any], switched: bool
    ) -> None:
        self.connection = connection
        self.driver = driver
        self.switched = switched
        self.hooks = _HOOKS.get(connection.sync_engine.pool, [])
        self._tx_hooks = _TX_HOOKS.get(connection.sync_engine.pool, [])

    def tell(self, command: str) -> None:
        """The transaction hooks told of psycopg's `command` (`BEGIN` only when none is open)."""
        idle = self.driver.pgconn.transaction_status == pq.TransactionStatus.IDLE
        if not self.driver.autocommit and idle == (command == "BEGIN"):
            for hook in self._tx_hooks:
                hook(command)

    @classmethod
    async def take(cls, database: Database, *, autocommit: bool) -> _Taken:
        connection = await database.engine.connect()
        try:
            raw = await connection.get_raw_connection()
            driver = raw.driver_connection
            assert isinstance(driver, psycopg.AsyncConnection)
            switched = driver.autocommit != autocommit
            if switched:
                await driver.set_autocommit(autocommit)
        except psycopg.Error as exc:
            await connection.invalidate()
            raise _store_error("SET autocommit", exc) from exc
        except BaseException:
            await connection.invalidate()
            raise
        return cls(connection, driver, switched)

    async def give_back(self) -> None:
        """Back to the pool in the mode it came in, after rolling back what was left
        uncommitted; thrown away instead when a statement was cut off mid-way (cancelled) or
        the link broke, or when putting it right fails."""
        driver = self.driver
        try:
            status = driver.pgconn.transaction_status
            if driver.broken or status not in _SETTLED:
                await self.connection.invalidate()
                return
            if status != pq.TransactionStatus.IDLE:
                self.tell("ROLLBACK")
                await driver.rollback()
            if self.switched:
                await driver.set_autocommit(not driver.autocommit)
        except (psycopg.Error, OSError):
            await self.connection.invalidate()
        finally:
            await self.connection.close()


_BETWEEN_STATEMENTS = (pq.TransactionStatus.INTRANS, pq.TransactionStatus.INERROR)
_SETTLED = (
    pq.TransactionStatus.IDLE,
    pq.TransactionStatus.INTRANS,
    pq.TransactionStatus.INERROR,
)


def _store_error(sql: str, exc: psycopg.Error) -> StoreError:
    """A psycopg error as SQLAlchemy raises it (`IntegrityError`, `OperationalError`, …),
    with the statement and never its parameters."""
    return DBAPIError.instance(sql, None, exc, psycopg.Error, hide_parameters=True)


class Database:
    """Where units of work come from: `async with database() as db` (commit it yourself),
    `async with database.begin() as db` (committed on leaving unless the block raised),
    `async with database.connect() as db` (autocommit: each statement commits by itself).

    Made with `autocommit=True`, its every unit of work is in autocommit: for work that is
    one statement (or only reads), two round trips fewer each (no `BEGIN`, no `COMMIT`); the
    caller still calls `commit()`, so the code reads the same and stays right if it ever
    runs in a transaction. An engine made with `autocommit=True` serves that as it is; any
    other is switched on each checkout and back on each return."""

    def __init__(self, engine: AsyncEngine, *, autocommit: bool = False) -> None:
        self.engine = engine
        self.address = engine.url.render_as_string(hide_password=True)
        self._autocommit = autocommit or engine.sync_engine in _AUTOCOMMIT_ENGINES

    @asynccontextmanager
    async def __call__(self) -> AsyncIterator[Db]:
        db = Db(self, autocommit=self._autocommit)
        try:
            yield db
        finally:
            await db.close()

    @asynccontextmanager
    async def begin(self) -> AsyncIterator[Db]:
        async with self() as db:
            yield db
            await db.commit()

    @asynccontextmanager
    async def connect(self) -> AsyncIterator[Db]:
        db = Db(self, autocommit=True)
        try:
            yield db
        finally:
            await db.close()


def connect(database: Database) -> AbstractAsyncContextManager[Db]:
    """A unit of work in autocommit mode: a statement commits by itself (no `BEGIN`, no
    `COMMIT`); `Db.transaction` for several that commit together."""
    return database.connect()


async def ping(db: Db) -> None:
    """One round trip (`SELECT 1`); raises while the database is unreachable."""
    await db.value("SELECT 1", {})
