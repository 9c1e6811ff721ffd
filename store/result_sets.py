"""Result sets: what a search found, kept as a referent of the session.

A row is written once per `search_orders` call (its id is derived from the call, so a retried
attempt finds the row the first wrote). Everything runs in the caller's transaction.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from psycopg.types.json import Jsonb

from parley.result_sets import StoredSet
from parley.store.db import Db

# How many of a session's newest sets the resolver weighs; older ones are out of reach.
RECENT_SETS = 6


async def record_result_set(
    conn: Db,
    *,
    result_set_id: str,
    session_id: str,
    turn_id: str,
    tool_call_id: str,
    user_seq: int,
    query: dict[str, Any],
    rows: list[dict[str, Any]],
) -> StoredSet:
    """Store a search's result once, in the order the search returned it: one statement
    (the set an earlier attempt stored, when there is one)."""
    params = {
        "id": result_set_id,
        "session_id": session_id,
        "turn_id": turn_id,
        "tool_call_id": tool_call_id,
        "user_seq": user_seq,
        "query": Jsonb(query),
        "order_ids": Jsonb([str(r["order_id"]) for r in rows]),
        "rows": Jsonb(rows),
    }
    found = await conn.made(_RECORD, params, _stored_columns)
    if found is None:  # stored by an attempt that committed after this statement began
        found = await conn.made(_SESSION_SET, params, _stored_columns)
    assert found is not None
    return found


def _stored_columns(*, id: str, query: Any, order_ids: Any, user_seq: int, rows: Any) -> StoredSet:
    return StoredSet(id, dict(query), list(order_ids), user_seq, list(rows))


# The second arm reads the snapshot from before the insert: exactly one arm holds the set,
# the one inserted or the one an earlier attempt stored (of this session only).
_RECORD = """
    WITH made AS (
        INSERT INTO result_sets
            (id, session_id, turn_id, tool_call_id, user_seq, query, order_ids, rows)
        VALUES (%(id)s, %(session_id)s, %(turn_id)s, %(tool_call_id)s, %(user_seq)s,
            %(query)s, %(order_ids)s, %(rows)s)
        ON CONFLICT (id) DO NOTHING
        RETURNING id, query, order_ids, user_seq, rows
    )
    SELECT id, query, order_ids, user_seq, rows FROM made
    UNION ALL
    SELECT id, query, order_ids, user_seq, rows FROM result_sets
    WHERE id = %(id)s AND session_id = %(session_id)s
    LIMIT 1
"""
_SESSION_SET = """
    SELECT id, query, order_ids, user_seq, rows FROM result_sets
    WHERE id = %(id)s AND session_id = %(session_id)s
"""


async def recent_result_sets(db: Db, *, session_id: str) -> list[StoredSet]:
    """The session's newest sets, oldest first."""
    rows = await db.rows(_RECENT, {"session_id": session_id, "limit": RECENT_SETS}, _SetRow)
    return [_stored_columns(**vars(r)) for r in reversed(rows)]


@dataclass(frozen=True)
class _SetRow:
    id: str
    query: Any
    order_ids: Any
    user_seq: int
    rows: Any


_RECENT = """
    SELECT id, query, order_ids, user_seq, rows FROM result_sets
    WHERE session_id = %(session_id)s AND NOT off_path
    ORDER BY user_seq DESC, created_at DESC, id DESC
    LIMIT %(limit)s
"""


async def offer_facts(
    db: Db, *, session_id: str, user_seq: int, recent_turns: int
) -> tuple[bool, frozenset[str]]:
    """What the tool offer asks of the session, in one round trip: whether it has stored any
    set, and the tools called in the turn at `user_seq` and its `recent_turns` turns before."""
    params = {"session_id": session_id, "user_seq": user_seq, "turns": recent_turns + 1}
    row = await db.row(_OFFER_FACTS, params, _OfferFacts)
    assert row is not None  # a select list without FROM: always one row
    return bool(row.has_sets), frozenset(row.recently_used or ())


@dataclass(frozen=True)
class _OfferFacts:
    has_sets: bool
    recently_used: list[str] | None


# What the offer asks, as subqueries of a session and a turn's seq (`{session}`,
# `{user_seq}`): here alone, or among a context build's rows (store/context.py).
HAS_SETS = "EXISTS (SELECT 1 FROM result_sets WHERE session_id = {session} AND NOT off_path)"
RECENTLY_USED = """(SELECT array_agg(DISTINCT name) FROM tool_calls WHERE turn_id IN (
        SELECT id FROM turns WHERE session_id = {session} AND user_seq <= {user_seq}
        ORDER BY user_seq DESC LIMIT %(turns)s))"""

# One statement: it runs in every context build that does not read it with the build's rows.
_OFFER_FACTS = f"""
    SELECT {HAS_SETS} AS has_sets, {RECENTLY_USED} AS recently_used
""".format(session="%(session_id)s", user_seq="%(user_seq)s")


async def session_result_set(conn: Db, *, session_id: str, result_set_id: str) -> StoredSet | None:
    """One set of this session; another session's set is the same as a missing one."""
    params = {"id": result_set_id, "session_id": session_id}
    return await conn.made(_SESSION_SET, params, _stored_columns)
