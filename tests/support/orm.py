"""An ORM session for a test's own arrangements and checks.

The product reaches PostgreSQL one way, through store/'s named statements on a `Db`
(store/db.py). A test may instead arrange and read rows through the schema's models, which
says what it checks more plainly than SQL would: `async with orm(sessions) as db`, on the
same pool, committed by the test itself.
"""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncSession

from parley.store.db import Database


def orm(database: Database) -> AsyncSession:
    """A session on `database`'s engine."""
    return AsyncSession(database.engine, expire_on_commit=False)
