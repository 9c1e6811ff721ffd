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

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession


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


_USAGE_SQL = text(
    """
    SELECT 'turns' AS part, count(*) AS requests,
           coalesce(sum((mc.usage ->> 'input_tokens')::bigint), 0) AS input_tokens,
           coalesce(sum((mc.usage ->> 'output_tokens')::bigint), 0) AS output_tokens
      FROM model_calls mc
      JOIN turns t ON t.id = mc.turn_id
      JOIN sessions s ON s.id = t.session_id
     WHERE s.tenant_id = :tenant_id AND mc.created_at >= :since AND mc.provider <> 'resolver'
    UNION ALL
    SELECT 'summaries', count(*), coalesce(sum(cs.input_tokens), 0),
           coalesce(sum(cs.output_tokens), 0)
      FROM conversation_summaries cs
      JOIN sessions s ON s.id = cs.session_id
     WHERE s.tenant_id = :tenant_id AND cs.created_at >= :since
    """
)


async def tenant_usage(db: AsyncSession, *, tenant_id: str, since: datetime) -> TenantUsage:
    """The tenant's tokens since `since`: its turns' and its summarizer's, apart."""
    rows = await db.execute(_USAGE_SQL, {"tenant_id": tenant_id, "since": since})
    parts = {
        row.part: Tokens(int(row.requests), int(row.input_tokens), int(row.output_tokens))
        for row in rows
    }
    return TenantUsage(since, parts.get("turns", Tokens()), parts.get("summaries", Tokens()))
