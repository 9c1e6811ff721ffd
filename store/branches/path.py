"""The active path, written: a branch made the session's active one marks what its path
leaves out (`off_path` on messages, result sets and summary versions), and the slots and
pinned facts a branch leaves are saved with it and restored on its return (the model:
store/branches/__init__.py). Only a fork or a switch writes these, never a plain turn.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from parley.store.branches.tree import BranchRow, on_path, path_of
from parley.store.db import Db


async def keep_before(db: Db, *, session_id: str, seq: int) -> None:
    """A new branch keeps the slots and pinned facts set before `seq`."""
    await db.run(_KEEP_BEFORE, {"session_id": session_id, "seq": seq})


_KEEP_BEFORE = """
    WITH slots_gone AS (
        DELETE FROM slots WHERE session_id = %(session_id)s AND set_at_seq >= %(seq)s
    )
    DELETE FROM pinned_facts WHERE session_id = %(session_id)s AND source_seq >= %(seq)s
"""


async def save(db: Db, *, session_id: str, number: int) -> None:
    """The slots and pinned facts as the branch `number` leaves them."""
    await db.run(_SAVE, {"session_id": session_id, "number": number})


_SAVE = """
    UPDATE branches SET saved = jsonb_build_object(
        'slots', (SELECT coalesce(jsonb_agg(jsonb_build_array(name, value, source, set_at_seq)),
            '[]') FROM slots WHERE session_id = %(session_id)s),
        'facts', (SELECT coalesce(jsonb_agg(jsonb_build_array(key, value, source_seq, source,
            memory_key)), '[]') FROM pinned_facts WHERE session_id = %(session_id)s))
    WHERE session_id = %(session_id)s AND number = %(number)s
"""


async def restore(db: Db, *, session_id: str, number: int) -> None:
    """The slots and pinned facts as the branch `number` left them, in place of the
    session's."""
    await db.run(_CLEAR_STATE, {"session_id": session_id})
    await db.run(_RESTORE, {"session_id": session_id, "number": number})


_CLEAR_STATE = """
    WITH slots_gone AS (DELETE FROM slots WHERE session_id = %(session_id)s)
    DELETE FROM pinned_facts WHERE session_id = %(session_id)s
"""
# The branch's saved slots and facts, once the session's are cleared (`_CLEAR_STATE`), less
# what was forgotten since (its message is gone) or withdrawn (a fact copied from a durable
# memory item that is no longer there).
_RESTORE = """
    WITH saved AS (
        SELECT saved FROM branches WHERE session_id = %(session_id)s AND number = %(number)s
    ), slots_back AS (
        INSERT INTO slots (session_id, name, value, source, set_at_seq)
        SELECT %(session_id)s, s->>0, s->1, s->>2, CAST(s->>3 AS integer)
        FROM saved, jsonb_array_elements(coalesce(saved->'slots', '[]')) AS s
        WHERE EXISTS (SELECT 1 FROM messages
            WHERE session_id = %(session_id)s AND seq = CAST(s->>3 AS integer))
    )
    INSERT INTO pinned_facts (session_id, key, value, source_seq, source, memory_key)
    SELECT %(session_id)s, f->>0, f->>1, CAST(f->>2 AS integer), f->>3, f->>4
    FROM saved, jsonb_array_elements(coalesce(saved->'facts', '[]')) AS f
    WHERE EXISTS (SELECT 1 FROM messages
            WHERE session_id = %(session_id)s AND seq = CAST(f->>2 AS integer))
        AND (f->>4 IS NULL OR EXISTS (
            SELECT 1 FROM user_memory AS um JOIN sessions AS s
                ON um.tenant_id = s.tenant_id AND um.user_id = s.user_id
            WHERE s.id = %(session_id)s AND um.key = f->>4))
"""


async def activate(db: Db, *, session_id: str, branches: dict[int, BranchRow], leaf: int) -> None:
    """Make `leaf` the session's active branch: mark what its path leaves out."""
    path = path_of(branches, leaf)
    params = {
        "session_id": session_id,
        "leaf": leaf,
        "branches": [b for b, _ in path],
        "limits": [limit for _, limit in path],
    }
    await db.run(_ACTIVATE, params)
    summaries = await db.rows(_SUMMARIES, {"session_id": session_id}, SummaryEnd)
    if summaries:
        hidden = summaries_off(branches, path, summaries, await _seqs(db, session_id))
        await db.run(_SUMMARIES_OFF, {"session_id": session_id, "hidden": hidden})


# On the path: a (branch, seq) the path's pairs hold. A result set follows its turn's.
_ON_PATH = """EXISTS (SELECT 1 FROM unnest(CAST(%(branches)s AS int[]),
        CAST(%(limits)s AS int[])) AS p(b, lim) WHERE p.b = {branch} AND {seq} < p.lim)"""
_ACTIVATE = f"""
    WITH session AS (
        UPDATE sessions SET branch = %(leaf)s WHERE id = %(session_id)s
    ), shown AS (
        UPDATE branches SET shown_at = clock_timestamp()
        WHERE session_id = %(session_id)s AND number = %(leaf)s
    ), message_marks AS (
        UPDATE messages AS m SET off_path = NOT {_ON_PATH.format(branch="m.branch", seq="m.seq")}
        WHERE m.session_id = %(session_id)s
    )
    UPDATE result_sets AS r
    SET off_path = NOT {_ON_PATH.format(branch="t.branch", seq="t.user_seq")}
    FROM turns AS t
    WHERE r.session_id = %(session_id)s AND t.id = r.turn_id
"""


@dataclass(frozen=True)
class SummaryEnd:
    """A summary version: the branch it was written on, and the seq it folds up to."""

    id: int
    branch: int
    through_seq: int


_SUMMARIES = """
    SELECT id, branch, through_seq FROM conversation_summaries WHERE session_id = %(session_id)s
"""


@dataclass(frozen=True)
class Placed:
    """A message's place in the tree: its seq and its branch."""

    seq: int
    branch: int


async def _seqs(db: Db, session_id: str) -> list[Placed]:
    return await db.rows(_SEQS, {"session_id": session_id}, Placed)


_SEQS = "SELECT seq, branch FROM messages WHERE session_id = %(session_id)s ORDER BY seq"
_SUMMARIES_OFF = """
    UPDATE conversation_summaries SET off_path = (id = ANY(%(hidden)s))
    WHERE session_id = %(session_id)s
"""


def summaries_off(
    branches: dict[int, BranchRow],
    path: Sequence[tuple[int, int]],
    summaries: Iterable[SummaryEnd],
    seqs: Sequence[Placed],
) -> list[int]:
    """The summary versions the path cannot read: written on a branch whose path differs
    from this one at or before the version's end."""
    hidden = []
    for summary in summaries:
        theirs = path_of(branches, summary.branch)
        for message in seqs:
            if message.seq > summary.through_seq:
                break
            mine = on_path(path, message.branch, message.seq)
            if mine != on_path(theirs, message.branch, message.seq):
                hidden.append(summary.id)
                break
    return hidden


def facts_dropped(drop: str) -> str:
    """The SET clause of an UPDATE of `branches` that takes from every saved state the
    pinned facts the SQL predicate `drop` holds for (over `f`, a saved fact: [key, value,
    source_seq, source, memory_key]). Composed by the statements that delete the same facts
    from the live ones (store/lifecycle/forget.py, store/user_memory.py): a fact forgotten or
    withdrawn is gone from every branch, not only the one shown."""
    kept = f"""(SELECT jsonb_agg(f) FROM jsonb_array_elements(saved->'facts') AS f
        WHERE NOT ({drop}))"""
    return f"saved = jsonb_set(saved, '{{facts}}', coalesce({kept}, '[]'))"
