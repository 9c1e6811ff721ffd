"""The trace ledger's table (`trace_spans`) and the lookup that names a turn's owners in
log lines (activities/tracing.py records the spans). Both run outside any step's unit of
work, each on a connection of its own in autocommit mode: one statement, no transaction."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from parley.store.db import Database, connect


@dataclass(frozen=True)
class Owners:
    session_id: str
    tenant_id: str


async def insert_spans(sessions: Database, spans: list[dict[str, Any]]) -> None:
    """Write any number of spans (dicts with the columns below) in one statement."""
    async with connect(sessions) as conn:
        await conn.run(_INSERT_SPANS, {"spans": json.dumps(spans, default=str)})


async def turn_owners(sessions: Database, turn_id: str) -> Owners | None:
    """The turn's session and tenant, or None for an unknown turn."""
    async with connect(sessions) as conn:
        return await conn.row(_OWNERS, {"turn_id": turn_id}, Owners)


_OWNERS = "SELECT session_id, tenant_id FROM turns WHERE id = %(turn_id)s"

# One statement for any number of spans, so it is prepared once per connection. A span of a
# step something other than a turn asked for (a summary pass after an import or a forgotten
# message names that as its `turn_id`) belongs to no turn's trace and is left out, rather
# than failing the whole batch on the table's reference to its turn.
_INSERT_SPANS = """
    INSERT INTO trace_spans
        (turn_id, name, attempt, started_at, ended_at, outcome, attrs, otel_trace_id)
    SELECT turn_id, name, attempt, started_at, ended_at, outcome, attrs, otel_trace_id
    FROM jsonb_to_recordset(CAST(%(spans)s AS jsonb)) AS s(
        turn_id text, name text, attempt int, started_at timestamptz, ended_at timestamptz,
        outcome text, attrs jsonb, otel_trace_id text
    )
    WHERE EXISTS (SELECT 1 FROM turns WHERE turns.id = s.turn_id)
"""
