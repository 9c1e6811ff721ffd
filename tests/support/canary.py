"""Where does a string live in the database? The data-lifecycle tests plant unique canary
strings in a user's messages, files and memory, and ask this module which columns of which
tables still hold them.

The scan finds the columns through PostgreSQL's catalogue, so a table added later is covered
without editing any test: every column of a text-like, JSON, full-text or binary type in the
`public` schema is searched (a `tsvector` holds stemmed lexemes, so canaries should be
lowercase letters and digits, which the `simple` and `english` configurations keep whole).
"""

from __future__ import annotations

from collections.abc import Iterable

import psycopg
from psycopg import sql

from parley.store.db import libpq_url

# The column types that can carry text a user wrote (arrays of them included).
TEXT_TYPES = ("text", "character varying", "character", "json", "jsonb", "tsvector", "bytea")
SKIPPED_TABLES = ("alembic_version",)


async def text_columns(
    conn: psycopg.AsyncConnection[tuple[object, ...]],
) -> list[tuple[str, str, str]]:
    """(table, column, type) for every searchable column of every table in `public`."""
    cursor = await conn.execute(
        """
        SELECT c.table_name, c.column_name,
               CASE WHEN c.data_type = 'ARRAY' THEN 'array'
                    WHEN c.data_type = 'USER-DEFINED' THEN c.udt_name
                    ELSE c.data_type END
          FROM information_schema.columns c
          JOIN information_schema.tables t
            ON t.table_schema = c.table_schema AND t.table_name = c.table_name
         WHERE c.table_schema = 'public' AND t.table_type = 'BASE TABLE'
           AND (c.data_type = ANY(%s) OR c.data_type = 'ARRAY' OR c.udt_name = 'tsvector')
           AND c.table_name <> ALL(%s)
         ORDER BY 1, 2
        """,
        (list(TEXT_TYPES), list(SKIPPED_TABLES)),
    )
    return [(str(t), str(c), str(kind)) for t, c, kind in await cursor.fetchall()]


def _matches(column: str, kind: str) -> sql.Composable:
    col = sql.Identifier(column)
    if kind == "bytea":
        return sql.SQL("position(convert_to(%(needle)s, 'UTF8') in {}) > 0").format(col)
    return sql.SQL("strpos(lower({}::text), lower(%(needle)s)) > 0").format(col)


async def scan(database_url: str, needles: Iterable[str]) -> dict[str, dict[str, int]]:
    """For each needle, the `table.column` places that hold it, with their row counts.
    An empty dict for a needle means it is nowhere."""
    found: dict[str, dict[str, int]] = {}
    async with await psycopg.AsyncConnection.connect(libpq_url(database_url)) as conn:
        columns = await text_columns(conn)
        for needle in needles:
            places: dict[str, int] = {}
            for table, column, kind in columns:
                query = sql.SQL("SELECT count(*) FROM {} WHERE {}").format(
                    sql.Identifier(table), _matches(column, kind)
                )
                row = await (await conn.execute(query, {"needle": needle})).fetchone()
                if row and row[0]:
                    places[f"{table}.{column}"] = int(row[0])
            found[needle] = places
    return found


async def table_fingerprints(database_url: str) -> dict[str, set[str]]:
    """Every row of every table as an md5 of its text form, by table: compare two of these to
    show that rows were left byte-identical (or to see exactly which rows went)."""
    async with await psycopg.AsyncConnection.connect(libpq_url(database_url)) as conn:
        cursor = await conn.execute(
            "SELECT table_name FROM information_schema.tables"
            " WHERE table_schema = 'public' AND table_type = 'BASE TABLE' ORDER BY 1"
        )
        tables = [str(t) for (t,) in await cursor.fetchall() if t not in SKIPPED_TABLES]
        prints: dict[str, set[str]] = {}
        for table in tables:
            query = sql.SQL("SELECT md5(t::text) FROM {} AS t").format(sql.Identifier(table))
            rows = await (await conn.execute(query)).fetchall()
            prints[table] = {str(r[0]) for r in rows}
    return prints
