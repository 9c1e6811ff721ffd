"""The API's pool finds a connection the server closed while it sat idle, without a query
(store/db.py `create_socket_checked_engine`): the next session gets a fresh connection, not
an error."""

from __future__ import annotations

import psycopg
from sqlalchemy import text

from parley.store.db import Database, create_socket_checked_engine, libpq_url
from tests.support.orm import orm
from tests.support.toolkit import eventually


async def _backend_pid(sessions: Database) -> int:
    async with orm(sessions) as db:
        return int(await db.scalar(text("SELECT pg_backend_pid()")))


async def test_a_connection_the_server_closed_is_replaced_at_checkout(database_url: str) -> None:
    engine = create_socket_checked_engine(database_url)
    sessions = Database(engine)
    try:
        first = await _backend_pid(sessions)
        assert await _backend_pid(sessions) == first  # pooled: the same connection again
        async with await psycopg.AsyncConnection.connect(
            libpq_url(database_url), autocommit=True
        ) as admin:
            await admin.execute("SELECT pg_terminate_backend(%s)", (first,))

            async def gone() -> bool:
                cur = await admin.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (first,)
                )
                row = await cur.fetchone()
                return row is not None and row[0] == 0

            await eventually(gone, timeout=10, what="the backend exits")
        # The pooled connection is dead; the checkout replaces it instead of failing.
        second = await _backend_pid(sessions)
        assert second != first
    finally:
        await engine.dispose()
