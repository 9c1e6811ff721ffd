"""The retention purge's SQL: which tenants to purge, and one batch of one table's expired rows.

parley/retention.py decides which tables a period covers and their cutoffs; each statement
here deletes at most `limit` rows of one table of one tenant that are older than the cutoff,
so a purge runs in short transactions that never hold many locks, and running it again
deletes only what is still there (idempotent). A row another row still points at (a message
with feedback written since the feedback step ran, a model call with a newer tool call) is
left for the next run rather than failing the batch. Nothing here commits (see `store`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select, text
from sqlalchemy.ext.asyncio import AsyncSession

from parley.retention import RetentionPeriods
from parley.tenancy import TenantConfig
from store.models import Tenant

# For each table: the rows of one tenant older than the cutoff (a `ctid` list, so one shape
# of DELETE serves tables with and without a single-column key).
_EXPIRED: dict[str, str] = {
    "feedback": """
        SELECT f.ctid FROM feedback f JOIN messages m ON m.id = f.message_id
        JOIN sessions s ON s.id = m.session_id
        WHERE s.tenant_id = :tenant AND m.created_at < :cutoff""",
    "messages": """
        SELECT m.ctid FROM messages m JOIN sessions s ON s.id = m.session_id
        WHERE s.tenant_id = :tenant AND m.created_at < :cutoff
          AND NOT EXISTS (SELECT 1 FROM feedback f WHERE f.message_id = m.id)""",
    "turn_events": """
        SELECT e.ctid FROM turn_events e JOIN turns t ON t.id = e.turn_id
        WHERE t.tenant_id = :tenant AND e.created_at < :cutoff""",
    "files": """
        SELECT f.ctid FROM files f WHERE f.tenant_id = :tenant AND f.created_at < :cutoff""",
    "result_sets": """
        SELECT r.ctid FROM result_sets r JOIN sessions s ON s.id = r.session_id
        WHERE s.tenant_id = :tenant AND r.created_at < :cutoff""",
    "actions": """
        SELECT a.ctid FROM actions a
        WHERE a.tenant_id = :tenant AND a.created_at < :cutoff AND a.status <> 'pending'""",
    "specialist_answers": """
        SELECT a.ctid FROM specialist_answers a JOIN turns t ON t.id = a.turn_id
        WHERE t.tenant_id = :tenant AND a.created_at < :cutoff""",
    "slots": """
        SELECT l.ctid FROM slots l JOIN sessions s ON s.id = l.session_id
        WHERE s.tenant_id = :tenant AND l.updated_at < :cutoff""",
    "handoffs": """
        SELECT h.ctid FROM handoffs h JOIN sessions s ON s.id = h.session_id
        WHERE s.tenant_id = :tenant AND h.created_at < :cutoff""",
    "tool_calls": """
        SELECT c.ctid FROM tool_calls c JOIN turns t ON t.id = c.turn_id
        WHERE t.tenant_id = :tenant AND c.created_at < :cutoff""",
    "model_calls": """
        SELECT c.ctid FROM model_calls c JOIN turns t ON t.id = c.turn_id
        WHERE t.tenant_id = :tenant AND c.created_at < :cutoff
          AND NOT EXISTS (SELECT 1 FROM tool_calls k WHERE k.model_call_id = c.id)""",
    "trace_spans": """
        SELECT p.ctid FROM trace_spans p JOIN turns t ON t.id = p.turn_id
        WHERE t.tenant_id = :tenant AND p.started_at < :cutoff""",
    "conversation_summaries": """
        SELECT c.ctid FROM conversation_summaries c JOIN sessions s ON s.id = c.session_id
        WHERE s.tenant_id = :tenant AND c.created_at < :cutoff""",
    "pinned_facts": """
        SELECT p.ctid FROM pinned_facts p JOIN sessions s ON s.id = p.session_id
        WHERE s.tenant_id = :tenant AND p.updated_at < :cutoff""",
    "user_memory": """
        SELECT u.ctid FROM user_memory u WHERE u.tenant_id = :tenant AND u.created_at < :cutoff""",
    "exports": """
        SELECT x.ctid FROM exports x WHERE x.tenant_id = :tenant AND x.expires_at < :cutoff""",
}
PURGEABLE = frozenset(_EXPIRED)


@dataclass(frozen=True)
class TenantRetention:
    tenant_id: str
    periods: RetentionPeriods


async def tenants_to_purge(db: AsyncSession, *, tenant_id: str | None) -> list[TenantRetention]:
    """Every tenant (or the one named) with its configured periods (unset: the defaults)."""
    query = select(Tenant.id, Tenant.config).order_by(Tenant.id)
    if tenant_id is not None:
        query = query.where(Tenant.id == tenant_id)
    out = []
    for row in await db.execute(query):
        config = TenantConfig.model_validate(row.config or {})
        out.append(TenantRetention(row.id, config.retention or RetentionPeriods()))
    return out


async def purge_batch(
    db: AsyncSession, *, tenant_id: str, table: str, cutoff: datetime, limit: int
) -> int:
    """Delete at most `limit` of the tenant's rows of `table` older than `cutoff`; how many."""
    if table not in _EXPIRED:
        raise ValueError(f"not a purgeable table: {table!r}")
    statement = text(f"DELETE FROM {table} WHERE ctid = ANY(ARRAY({_EXPIRED[table]} LIMIT :limit))")
    result = await db.execute(statement, {"tenant": tenant_id, "cutoff": cutoff, "limit": limit})
    return int(result.rowcount)  # type: ignore[attr-defined]
