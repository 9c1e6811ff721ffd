"""A tenant's token usage, read from the record: what its turns' model calls and its
sessions' summarizer cost.

Turns' usage is on their model calls (`model_calls.usage`, as the provider reported it); the
summarizer's is on each summary version it wrote (`conversation_summaries`, input and output
tokens). Both are summed here per tenant since a point in time, so an operator sees what
the memory costs beside what the answers cost. Read-only; nothing here commits.

What this does not see: a session erased since (its calls and summaries go with it), and a
summarizer request whose answer wrote no summary version.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from parley.store.db import Db


@dataclass(frozen=True)
class Tokens:
    requests: int = 0
    input_tokens: int = 0
    output_tokens: int = 0

    def __add__(self, other: Tokens) -> Tokens:
        return Tokens(
            self.requests + other.requests,
            self.input_tokens + other.input_tokens,
            self.output_tokens + other.output_tokens,
        )


@dataclass(frozen=True)
class TenantUsage:
    since: datetime
    turns: Tokens  # the turns' model calls (code's own answers are no model calls)
    summaries: Tokens  # the summarizer: one request per summary version it wrote

    @property
    def total(self) -> Tokens:
        return self.turns + self.summaries


@dataclass(frozen=True)
class _Part:
    part: str
    requests: int
    input_tokens: int
    output_tokens: int


# Sums are cast back to bigint (PostgreSQL sums a bigint as numeric).
_USAGE_SQL = """
    SELECT 'turns' AS part, count(*) AS requests,
           coalesce(sum((mc.usage ->> 'input_tokens')::bigint), 0)::bigint AS input_tokens,
           coalesce(sum((mc.usage ->> 'output_tokens')::bigint), 0)::bigint AS output_tokens
      FROM model_calls mc
      JOIN turns t ON t.id = mc.turn_id
      JOIN sessions s ON s.id = t.session_id
     WHERE s.tenant_id = %(tenant_id)s AND mc.created_at >= %(since)s
       AND mc.provider <> 'resolver'
    UNION ALL
    SELECT 'summaries', count(*), coalesce(sum(cs.input_tokens), 0)::bigint,
           coalesce(sum(cs.output_tokens), 0)::bigint
      FROM conversation_summaries cs
      JOIN sessions s ON s.id = cs.session_id
     WHERE s.tenant_id = %(tenant_id)s AND cs.created_at >= %(since)s
"""


async def tenant_usage(db: Db, *, tenant_id: str, since: datetime) -> TenantUsage:
    """The tenant's tokens since `since`: its turns' and its summarizer's, apart."""
    rows = await db.rows(_USAGE_SQL, {"tenant_id": tenant_id, "since": since}, _Part)
    parts = {row.part: Tokens(row.requests, row.input_tokens, row.output_tokens) for row in rows}
    return TenantUsage(since, parts.get("turns", Tokens()), parts.get("summaries", Tokens()))


@dataclass(frozen=True)
class Span:
    name: str
    attempt: int
    started_at: datetime
    ended_at: datetime
    outcome: str
    attrs: dict[str, Any] | None


@dataclass(frozen=True)
class TurnRun:
    """One turn of a session as an operator reads it: its model tokens and its trace."""

    turn_id: str
    created_at: datetime
    tokens: Tokens
    trace: list[Span]


@dataclass(frozen=True)
class _TurnTokens:
    turn_id: str
    created_at: datetime
    requests: int
    input_tokens: int
    output_tokens: int


_SESSION_TURNS_SQL = """
    SELECT t.id AS turn_id, t.created_at,
           count(mc.*) FILTER (WHERE mc.provider <> 'resolver') AS requests,
           coalesce(sum((mc.usage ->> 'input_tokens')::bigint)
                    FILTER (WHERE mc.provider <> 'resolver'), 0)::bigint AS input_tokens,
           coalesce(sum((mc.usage ->> 'output_tokens')::bigint)
                    FILTER (WHERE mc.provider <> 'resolver'), 0)::bigint AS output_tokens
      FROM turns t
      JOIN sessions s ON s.id = t.session_id
      LEFT JOIN model_calls mc ON mc.turn_id = t.id
     WHERE s.tenant_id = %(tenant_id)s AND s.id = %(session_id)s
     GROUP BY t.id, t.created_at
     ORDER BY t.created_at, t.id
"""


@dataclass(frozen=True)
class _TurnSpan(Span):
    turn_id: str


_SESSION_SPANS_SQL = """
    SELECT ts.turn_id, ts.name, ts.attempt, ts.started_at, ts.ended_at, ts.outcome, ts.attrs
      FROM trace_spans ts
      JOIN turns t ON t.id = ts.turn_id
      JOIN sessions s ON s.id = t.session_id
     WHERE s.tenant_id = %(tenant_id)s AND s.id = %(session_id)s
     ORDER BY ts.started_at, ts.id
"""


_SESSION_OF_TENANT_SQL = (
    "SELECT 1 FROM sessions WHERE id = %(session_id)s AND tenant_id = %(tenant_id)s"
)


async def session_turns(db: Db, *, tenant_id: str, session_id: str) -> list[TurnRun] | None:
    """A session's turns in order, each with its model tokens and its trace spans; None for
    a session that is not the tenant's (or none)."""
    where = {"tenant_id": tenant_id, "session_id": session_id}
    if await db.value(_SESSION_OF_TENANT_SQL, where) is None:
        return None
    spans: dict[str, list[Span]] = {}
    for row in await db.rows(_SESSION_SPANS_SQL, where, _TurnSpan):
        spans.setdefault(row.turn_id, []).append(row)
    return [
        TurnRun(
            turn_id=row.turn_id,
            created_at=row.created_at,
            tokens=Tokens(row.requests, row.input_tokens, row.output_tokens),
            trace=spans.get(row.turn_id, []),
        )
        for row in await db.rows(_SESSION_TURNS_SQL, where, _TurnTokens)
    ]
