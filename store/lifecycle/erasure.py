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
from typing import Any, ClassVar

from parley.erasure import ErasureScope, ErasureStatus, subject_hash
from parley.ids import new_id
from parley.store.db import Db
from parley.store.identity import revoke_user_tokens
from parley.store.lifecycle.erasure_catalogue import (
    Subject,
    delete_batch,
    erase_sourced_memory_copies,
)


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

    COLUMNS: ClassVar[str] = (
        "id, scope, tenant_id, status, counts, requested_at, started_at, finished_at, grace_s"
    )


async def request_erasure(
    db: Db,
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
    params = {
        "id": new_id("era"),
        "scope": (ErasureScope.user if session_id is None else ErasureScope.session).value,
        "tenant_id": tenant_id,
        "subject_hash": subject_hash(key, *parts),
        "user_id": user_id,
        "session_id": session_id,
        "status": ErasureStatus.requested.value,
        "grace_s": grace_s,
    }
    row = await db.row(_REQUEST, params, ErasureRow)
    assert row is not None
    if session_id is None:
        await revoke_user_tokens(db, tenant_id=tenant_id, user_id=user_id)
    return row


_REQUEST = f"""
    INSERT INTO erasures (id, scope, tenant_id, subject_hash, user_id, session_id, status,
                          grace_s, counts)
    VALUES (%(id)s, %(scope)s, %(tenant_id)s, %(subject_hash)s, %(user_id)s, %(session_id)s,
            %(status)s, %(grace_s)s, '{{}}')
    RETURNING {ErasureRow.COLUMNS}
"""


async def get_erasure(db: Db, *, erasure_id: str) -> ErasureRow | None:
    return await db.row(_GET, {"id": erasure_id}, ErasureRow)


_GET = f"SELECT {ErasureRow.COLUMNS} FROM erasures WHERE id = %(id)s"


async def find_receipts(db: Db, *, hashes: list[str]) -> list[ErasureRow]:
    """The erasures whose subject hashes to one of these, oldest first."""
    return await db.rows(_RECEIPTS, {"hashes": hashes}, ErasureRow)


_RECEIPTS = f"""
    SELECT {ErasureRow.COLUMNS} FROM erasures
    WHERE subject_hash = ANY(%(hashes)s::text[]) ORDER BY requested_at
"""


@dataclass(frozen=True)
class _SubjectRow:
    scope: str
    tenant_id: str
    user_id: str | None
    session_id: str | None


async def subject_of(db: Db, *, erasure_id: str) -> Subject | None:
    """Whose rows the erasure deletes; None once it is done (the ids are cleared)."""
    row = await db.row(_SUBJECT, {"id": erasure_id}, _SubjectRow)
    if row is None or row.user_id is None:
        return None
    return Subject(ErasureScope(row.scope), row.tenant_id, row.user_id, row.session_id)


_SUBJECT = "SELECT scope, tenant_id, user_id, session_id FROM erasures WHERE id = %(id)s"


async def mark_started(db: Db, *, erasure_id: str) -> None:
    """The workflow runs: the start is confirmed and the work begins (once)."""
    await db.run(_STARTED, {"id": erasure_id})


_STARTED = """
    UPDATE erasures SET workflow_started_at = coalesce(workflow_started_at, now()),
        started_at = coalesce(started_at, now()),
        status = CASE WHEN status = 'requested' THEN 'running' ELSE status END
    WHERE id = %(id)s
"""


async def mark_workflow_started(db: Db, *, erasure_id: str) -> None:
    await db.run(_WORKFLOW_STARTED, {"id": erasure_id})


_WORKFLOW_STARTED = """
    UPDATE erasures SET workflow_started_at = now()
    WHERE id = %(id)s AND workflow_started_at IS NULL
"""


async def unstarted(db: Db, *, older_than: timedelta, limit: int = 50) -> list[ErasureRow]:
    """Erasures whose workflow start was never confirmed (the API died after its commit)."""
    cutoff = datetime.now(UTC) - older_than
    return await db.rows(_UNSTARTED, {"cutoff": cutoff, "limit": limit}, ErasureRow)


_UNSTARTED = f"""
    SELECT {ErasureRow.COLUMNS} FROM erasures
    WHERE workflow_started_at IS NULL AND requested_at < %(cutoff)s
    ORDER BY requested_at LIMIT %(limit)s
"""


async def erase_batch(db: Db, *, erasure_id: str, table: str, limit: int) -> int:
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


async def set_count(db: Db, *, erasure_id: str, key: str, n: int) -> None:
    """Set one count on the receipt (for what is counted whole, not batch by batch: the
    drafts an erasure set aside, store/lifecycle/eval_drafts.py)."""
    await db.run(_SET, {"id": erasure_id, "key": key, "n": n})


_SET = """
    UPDATE erasures SET counts = jsonb_set(counts, ARRAY[%(key)s::text], to_jsonb(%(n)s::int))
    WHERE id = %(id)s
"""


async def _count(db: Db, *, erasure_id: str, counts: dict[str, int]) -> None:
    for table, n in counts.items():
        await db.run(_ADD, {"id": erasure_id, "table": table, "n": n})


# Adds to one table's count in the receipt's JSON, in place (concurrent batches never race:
# one workflow runs one step at a time).
_ADD = """
    UPDATE erasures SET counts = jsonb_set(counts, ARRAY[%(table)s::text],
        to_jsonb(coalesce((counts ->> %(table)s::text)::integer, 0) + %(n)s::int))
    WHERE id = %(id)s
"""


async def finish(db: Db, *, erasure_id: str) -> ErasureRow | None:
    """Close the erasure: the receipt stays, the ids in clear go. The update takes the row's
    lock, so of two that race the second finds it done and answers the receipt."""
    params = {"id": erasure_id, "done": ErasureStatus.done.value}
    closed = await db.row(_FINISH, params, ErasureRow)
    return closed if closed is not None else await db.row(_GET, params, ErasureRow)


_FINISH = f"""
    UPDATE erasures SET user_id = NULL, session_id = NULL, status = %(done)s,
        finished_at = clock_timestamp()
    WHERE id = %(id)s AND status <> %(done)s
    RETURNING {ErasureRow.COLUMNS}
"""


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
