"""Result sets: what a search found, kept as a referent of the session.

A row is written once per `search_orders` call (its id is derived from the call, so a retried
attempt finds the row the first wrote). Everything runs in the caller's transaction.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Row, select, text
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession

from parley.result_sets import StoredSet
from store.models import ResultSet

# How many of a session's newest sets the resolver weighs; older ones are out of reach.
RECENT_SETS = 6


def _stored(row: ResultSet | Row[Any]) -> StoredSet:
    return StoredSet(row.id, dict(row.query), list(row.order_ids), row.user_seq, list(row.rows))


async def record_result_set(
    db: AsyncSession,
    *,
    result_set_id: str,
    session_id: str,
    turn_id: str,
    tool_call_id: str,
    user_seq: int,
    query: dict[str, Any],
    rows: list[dict[str, Any]],
) -> StoredSet:
    """Store a search's result once, in the order the search returned it."""
    await db.execute(
        insert(ResultSet)
        .values(
            id=result_set_id,
            session_id=session_id,
            turn_id=turn_id,
            tool_call_id=tool_call_id,
            user_seq=user_seq,
            query=query,
            order_ids=[str(r["order_id"]) for r in rows],
            rows=rows,
        )
        .on_conflict_do_nothing(index_elements=[ResultSet.id])
    )
    row = await db.get(ResultSet, result_set_id, populate_existing=True)
    assert row is not None and row.session_id == session_id
    return _stored(row)


async def recent_result_sets(db: AsyncSession, *, session_id: str) -> list[StoredSet]:
    """The session's newest sets, oldest first (their columns: no mapped rows to keep)."""
    rows = await db.execute(
        select(
            ResultSet.id, ResultSet.query, ResultSet.order_ids, ResultSet.user_seq, ResultSet.rows
        )
        .where(ResultSet.session_id == session_id)
        .order_by(ResultSet.user_seq.desc(), ResultSet.created_at.desc(), ResultSet.id.desc())
        .limit(RECENT_SETS)
    )
    return [_stored(r) for r in reversed(list(rows))]


async def offer_facts(
    db: AsyncSession, *, session_id: str, user_seq: int, recent_turns: int
) -> tuple[bool, frozenset[str]]:
    """What the tool offer asks of the session, in one round trip: whether it has stored any
    set, and the tools called in the turn at `user_seq` and its `recent_turns` turns before."""
    row = (
        await db.execute(
            _OFFER_FACTS,
            {"session_id": session_id, "user_seq": user_seq, "turns": recent_turns + 1},
        )
    ).one()
    return bool(row.has_sets), frozenset(row.recently_used or ())


# Plain SQL: it runs in every context build, and as an ORM statement its subqueries cost more
# to prepare than to run.
_OFFER_FACTS = text(
    """
    SELECT EXISTS (SELECT 1 FROM result_sets WHERE session_id = :session_id) AS has_sets, (
        SELECT array_agg(DISTINCT name) FROM tool_calls WHERE turn_id IN (
            SELECT id FROM turns WHERE session_id = :session_id AND user_seq <= :user_seq
            ORDER BY user_seq DESC LIMIT :turns
        )
    ) AS recently_used
    """
)


async def session_result_set(
    db: AsyncSession, *, session_id: str, result_set_id: str
) -> StoredSet | None:
    """One set of this session; another session's set is the same as a missing one."""
    row = await db.scalar(
        select(ResultSet).where(ResultSet.id == result_set_id, ResultSet.session_id == session_id)
    )
    return _stored(row) if row is not None else None
