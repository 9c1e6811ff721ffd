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
from typing import Any

from parley.retention import RetentionPeriods
from parley.store.db import Db
from parley.tenancy import TenantConfig


@dataclass(frozen=True)
class _Expiry:
    """How a table's rows find their tenant and their age: `owner` is the key the row
    reaches its tenant through (`session_id`, `turn_id`, `handoff_id`, or None: its own
    `tenant_id`),
    `stamp` the column compared with the cutoff, `keep` a further condition on the row `x`."""

    owner: str | None
    stamp: str = "created_at"
    keep: str = ""

    def select(self, table: str) -> str:
        """The `ctid`s of one tenant's expired rows (a `ctid` list, so one shape of DELETE
        serves tables with and without a single-column key)."""
        rows = f"{table} x"
        tenant = "x.tenant_id"
        if self.owner is not None:
            owners = {"session_id": "sessions", "turn_id": "turns", "handoff_id": "handoffs"}[
                self.owner
            ]
            rows, tenant = f"{rows} JOIN {owners} o ON o.id = x.{self.owner}", "o.tenant_id"
        keep = f" AND {self.keep}" if self.keep else ""
        where = f"{tenant} = %(tenant)s AND x.{self.stamp} < %(cutoff)s{keep}"
        return f"SELECT x.ctid FROM {rows} WHERE {where}"


_BY_SESSION, _BY_TURN, _OWN = _Expiry("session_id"), _Expiry("turn_id"), _Expiry(None)
_EXPIRIES: dict[str, _Expiry] = {
    # A message someone rated stays until its feedback has gone (its step runs first).
    "messages": _Expiry(
        "session_id", keep="NOT EXISTS (SELECT 1 FROM feedback f WHERE f.message_id = x.id)"
    ),
    "turn_events": _BY_TURN,
    "session_events": _BY_SESSION,
    "files": _OWN,
    "result_sets": _BY_SESSION,
    "actions": _Expiry(None, keep="x.status <> 'pending'"),
    "specialist_answers": _BY_TURN,
    "slots": _Expiry("session_id", stamp="updated_at"),
    # A case's log and notes go with their case's period; an open case stays (it holds its
    # session until a person ends it).
    "handoff_events": _Expiry("handoff_id"),
    "handoff_notes": _Expiry("handoff_id"),
    "webhook_deliveries": _OWN,
    "handoffs": _Expiry("session_id", keep="x.status NOT IN ('waiting', 'claimed')"),
    "tool_calls": _BY_TURN,
    # A model call a newer tool call points at waits for that tool call.
    "model_calls": _Expiry(
        "turn_id", keep="NOT EXISTS (SELECT 1 FROM tool_calls k WHERE k.model_call_id = x.id)"
    ),
    "trace_spans": _Expiry("turn_id", stamp="started_at"),
    "conversation_summaries": _BY_SESSION,
    "pinned_facts": _Expiry("session_id", stamp="updated_at"),
    "user_memory": _OWN,
    "exports": _Expiry(None, stamp="expires_at"),
}
# For each table: the rows of one tenant older than the cutoff. Feedback is dated by the
# message it rates.
_EXPIRED: dict[str, str] = {
    "feedback": """
        SELECT f.ctid FROM feedback f JOIN messages m ON m.id = f.message_id
        JOIN sessions s ON s.id = m.session_id
        WHERE s.tenant_id = %(tenant)s AND m.created_at < %(cutoff)s""",
    **{table: expiry.select(table) for table, expiry in _EXPIRIES.items()},
}
PURGEABLE = frozenset(_EXPIRED)


@dataclass(frozen=True)
class TenantRetention:
    tenant_id: str
    periods: RetentionPeriods


async def tenants_to_purge(db: Db, *, tenant_id: str | None) -> list[TenantRetention]:
    """Every tenant (or the one named) with its configured periods (unset: the defaults)."""
    out = []
    for row in await db.rows(_TENANTS, {"tenant_id": tenant_id}, _TenantConfig):
        config = TenantConfig.model_validate(row.config or {})
        out.append(TenantRetention(row.id, config.retention or RetentionPeriods()))
    return out


@dataclass(frozen=True)
class _TenantConfig:
    id: str
    config: dict[str, Any] | None


_TENANTS = """
    SELECT id, config FROM tenants
    WHERE %(tenant_id)s::text IS NULL OR id = %(tenant_id)s
    ORDER BY id
"""


async def purge_batch(db: Db, *, tenant_id: str, table: str, cutoff: datetime, limit: int) -> int:
    """Delete at most `limit` of the tenant's rows of `table` older than `cutoff`; how many."""
    if table not in _EXPIRED:
        raise ValueError(f"not a purgeable table: {table!r}")
    statement = f"DELETE FROM {table} WHERE ctid = ANY(ARRAY({_EXPIRED[table]} LIMIT %(limit)s))"
    return await db.run(statement, {"tenant": tenant_id, "cutoff": cutoff, "limit": limit})
