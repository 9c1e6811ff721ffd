"""Statements sent through psycopg's own connection (store/db.py `driver_sql`,
`driver_connection`): written once for SQLAlchemy's `text()`, they mean the same there."""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from store.db import autocommit, driver_connection, driver_sql

STATEMENT = (
    "SELECT CAST(:word AS text) || '%' AS tagged, :word LIKE 'wid%' AS starts, '12:30'::time AS t"
)


def test_placeholders_become_psycopgs_and_casts_and_literals_stay() -> None:
    assert driver_sql("SELECT CAST(:a AS int), x::jsonb, '1:30' FROM t WHERE y LIKE 'a%'") == (
        "SELECT CAST(%(a)s AS int), x::jsonb, '1:30' FROM t WHERE y LIKE 'a%%'"
    )


async def test_one_statement_means_the_same_on_both_paths(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    async with sessions() as db:
        through_sqlalchemy = (await db.execute(text(STATEMENT), {"word": "widget"})).one()
    async with sessions() as db:
        connection = await driver_connection(await autocommit(db))
        cursor = await connection.execute(driver_sql(STATEMENT), {"word": "widget"})
        through_psycopg = await cursor.fetchone()
    assert tuple(through_sqlalchemy) == through_psycopg
    assert through_psycopg is not None and through_psycopg[:2] == ("widget%", True)
