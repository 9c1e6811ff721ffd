"""The trace ledger's table (`trace_spans`) and the lookup that names a turn's owners in
log lines (activities/tracing.py records the spans). Both run outside any step's unit of
work, each in a session of its own in autocommit mode: one statement, no transaction."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select

from store.db import SessionMaker, autocommit, driver_connection, driver_sql
from store.models import Turn


@dataclass(frozen=True)
class Owners:
    session_id: str
    tenant_id: str


async def insert_spans(sessions: SessionMaker, spans: list[dict[str, Any]]) -> None:
    """Write any number of spans (dicts with the columns below) in one statement."""
    async with sessions() as db:
        connection = await driver_connection(await autocommit(db))
        await connection.execute(_INSERT_SPANS, {"spans": json.dumps(spans, default=str)})


async def turn_owners(sessions: SessionMaker, turn_id: str) -> Owners | None:
    """The turn's session and tenant, or None for an unknown turn."""
    async with sessions() as db:
        await autocommit(db)
        row = (await db.execute(_OWNERS.where(Turn.id == turn_id))).first()
    return None if row is None else Owners(row.session_id, row.tenant_id)


_OWNERS = select(Turn.session_id, Turn.tenant_id)

# One statement for any number of spans, so it is prepared once per connection; sent by
# psycopg itself (several times a turn, and SQLAlchemy's layer costs more than the statement).
_INSERT_SPANS = driver_sql(
    """
    INSERT INTO trace_spans
        (turn_id, name, attempt, started_at, ended_at, outcome, attrs, otel_trace_id)
    SELECT turn_id, name, attempt, started_at, ended_at, outcome, attrs, otel_trace_id
    FROM jsonb_to_recordset(CAST(:spans AS jsonb)) AS s(
        turn_id text, name text, attempt int, started_at timestamptz, ended_at timestamptz,
        outcome text, attrs jsonb, otel_trace_id text
    )
    """
)
