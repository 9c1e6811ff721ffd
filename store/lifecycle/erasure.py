"""Erasures: the request, its progress and its receipt (one `erasures` row each).

A request is committed with its scope, its subject's ids and a keyed hash of them; the
user's tokens are revoked in the same transaction (a user being erased writes nothing new).
Each batch the workflow deletes adds its count to the row in the batch's own transaction
(`erase_batch`), so the receipt counts every row once however often a step is retried. The
last step clears the ids in clear: the receipt keeps the hash, the tenant, the times and the
counts. Nothing here commits (see `store`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import func, select, text, update
from sqlalchemy.ext.asyncio import AsyncSession

from parley.erasure import ErasureScope, ErasureStatus, subject_hash
from parley.ids import new_id
from parley.store.identity import revoke_user_tokens
from parley.store.lifecycle.erasure_catalogue import (
    Subject,
    delete_batch,
    erase_sourced_memory_copies,
)
from parley.store.models import Erasure
from parley.store.rows import typed_row


@dataclass(frozen=True)
class ErasureRow:
    """An erasure as callers read it: no ids of its subject."""

    id: str
    scope: str
    tenant_id: str
    status: str
    counts: dict[str, int]
    requested_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    grace_s: float

    @classmethod
    def of(cls, row: Erasure) -> ErasureRow:
        return typed_row(cls, row, counts=dict(row.counts or {}))


async def request_erasure(
    db: AsyncSession,
    *,
    key: str,
    tenant_id: str,
    user_id: str,
    session_id: str | None = None,
    grace_s: float = 0.0,
) -> ErasureRow:
    """Record an erasure of the user (or of one of their sessions, after `grace_s`). Erasing
    a user revokes their tokens at once."""
    parts = (tenant_id, user_id) if session_id is None else (tenant_id, user_id, session_id)
    row = Erasure(
        id=new_id("era"),
        scope=ErasureScope.user if session_id is None else ErasureScope.session,
        tenant_id=tenant_id,
        subject_hash=subject_hash(key, *parts),
        user_id=user_id,
        session_id=session_id,
        status=ErasureStatus.requested,
        grace_s=grace_s,
        counts={},
    )
    db.add(row)
    if session_id is None:
        await revoke_user_tokens(db, tenant_id=tenant_id, user_id=user_id)
    await db.flush()
    await db.refresh(row)
    return ErasureRow.of(row)


async def get_erasure(db: AsyncSession, *, erasure_id: str) -> ErasureRow | None:
    row = await db.get(Erasure, erasure_id)
    return ErasureRow.of(row) if row is not None else None


async def find_receipts(db: AsyncSession, *, hashes: list[str]) -> list[ErasureRow]:
    """The erasures whose subject hashes to one of these, oldest first."""
    rows = await db.scalars(
        select(Erasure).where(Erasure.subject_hash.in_(hashes)).order_by(Erasure.requested_at)
    )
    return [ErasureRow.of(row) for row in rows]


async def subject_of(db: AsyncSession, *, erasure_id: str) -> Subject | None:
    """Whose rows the erasure deletes; None once it is done (the ids are cleared)."""
    row = await db.get(Erasure, erasure_id)
    if row is None or row.user_id is None:
        return None
    scope = ErasureScope(row.scope)
    return Subject(scope, row.tenant_id, row.user_id, row.session_id)


async def mark_started(db: AsyncSession, *, erasure_id: str) -> None:
    """The workflow runs: the start is confirmed and the work begins (once)."""
    await db.execute(_STARTED, {"id": erasure_id})


_STARTED = text(
    "UPDATE erasures SET workflow_started_at = coalesce(workflow_started_at, now()),"
    " started_at = coalesce(started_at, now()),"
    " status = CASE WHEN status = 'requested' THEN 'running' ELSE status END"
    " WHERE id = :id"
)


async def mark_workflow_started(db: AsyncSession, *, erasure_id: str) -> None:
    await db.execute(
        update(Erasure)
        .where(Erasure.id == erasure_id, Erasure.workflow_started_at.is_(None))
        .values(workflow_started_at=func.now())
    )


async def unstarted(
    db: AsyncSession, *, older_than: timedelta, limit: int = 50
) -> list[ErasureRow]:
    """Erasures whose workflow start was never confirmed (the API died after its commit)."""
    cutoff = datetime.now(UTC) - older_than
    rows = await db.scalars(
        select(Erasure)
        .where(Erasure.workflow_started_at.is_(None), Erasure.requested_at < cutoff)
        .order_by(Erasure.requested_at)
        .limit(limit)
    )
    return [ErasureRow.of(row) for row in rows]


async def erase_batch(db: AsyncSession, *, erasure_id: str, table: str, limit: int) -> int:
    """One batch of the erasure's rows of `table`, counted on its receipt in the same
    transaction; how many rows went (0: the table holds none of the subject's rows)."""
    subject = await subject_of(db, erasure_id=erasure_id)
    if subject is None:
        return 0
    counts: dict[str, int] = {}
    if table == "user_memory" and subject.scope is ErasureScope.session:
        counts = await erase_sourced_memory_copies(db, subject=subject)
    deleted = await delete_batch(db, subject=subject, table=table, limit=limit)
    counts[table] = counts.get(table, 0) + deleted
    await _count(db, erasure_id=erasure_id, counts={t: n for t, n in counts.items() if n})
    return deleted


async def set_count(db: AsyncSession, *, erasure_id: str, key: str, n: int) -> None:
    """Set one count on the receipt (for what is counted whole, not batch by batch: the
    drafts an erasure set aside, store/lifecycle/eval_drafts.py)."""
    await db.execute(_SET, {"id": erasure_id, "key": key, "n": n})


_SET = text(
    "UPDATE erasures SET counts = jsonb_set(counts, ARRAY[CAST(:key AS text)], to_jsonb(:n))"
    " WHERE id = :id"
)


async def _count(db: AsyncSession, *, erasure_id: str, counts: dict[str, int]) -> None:
    for table, n in counts.items():
        await db.execute(_ADD, {"id": erasure_id, "table": table, "n": n})


# Adds to one table's count in the receipt's JSON, in place (concurrent batches never race:
# one workflow runs one step at a time).
_ADD = text(
    "UPDATE erasures SET counts = jsonb_set(counts, ARRAY[CAST(:table AS text)],"
    " to_jsonb(coalesce(CAST(counts ->> CAST(:table AS text) AS integer), 0) + :n))"
    " WHERE id = :id"
)


async def finish(db: AsyncSession, *, erasure_id: str) -> ErasureRow | None:
    """Close the erasure: the receipt stays, the ids in clear go."""
    row = await db.get(Erasure, erasure_id, with_for_update=True)
    if row is None:
        return None
    if row.status != ErasureStatus.done:
        row.user_id = None
        row.session_id = None
        row.status = ErasureStatus.done
        row.finished_at = datetime.now(UTC)
        await db.flush()
    return ErasureRow.of(row)


def receipt_view(row: ErasureRow) -> dict[str, Any]:
    """The receipt as plain data (the CLI prints it)."""
    return {
        "erasure_id": row.id,
        "scope": row.scope,
        "tenant_id": row.tenant_id,
        "status": row.status,
        "requested_at": row.requested_at.isoformat(),
        "started_at": row.started_at.isoformat() if row.started_at else None,
        "finished_at": row.finished_at.isoformat() if row.finished_at else None,
        "counts": dict(sorted(row.counts.items())),
        "total": sum(row.counts.values()),
    }
