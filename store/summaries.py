"""The rolling summary's runs: the versions a run writes, what each folded, how many in a row
the code wrote in place of the model, and the backlog a turn's check reads to decide whether
a run has work. The prompt's reads of the summary are in `store.memory`.

Like every store module these never commit; the caller does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from psycopg.types.json import Jsonb

from parley.fold import FALLBACK
from parley.memory import SummaryLine
from parley.store import locks
from parley.store.db import Db


async def lock_session_memory(db: Db, *, session_id: str) -> None:
    """Serialise summary writers of one session (not the session row: turns keep writing)."""
    await locks.hold(db, locks.session_summary(session_id))


async def fallbacks_in_a_row(db: Db, *, session_id: str) -> int:
    """How many of the session's latest summary versions the code wrote (`fallback`), counted
    back to the newest one a model wrote."""
    count = await db.value(_FALLBACKS, {"session_id": session_id, "fallback": FALLBACK})
    return int(count or 0)


_FALLBACKS = """
    SELECT count(*) FROM conversation_summaries
    WHERE session_id = %(session_id)s AND NOT off_path AND through_seq > (
        SELECT coalesce(max(through_seq), 0) FROM conversation_summaries
        WHERE session_id = %(session_id)s AND NOT off_path AND written_by <> %(fallback)s)
"""


async def save_summary(
    db: Db,
    *,
    session_id: str,
    through_seq: int,
    lines: list[SummaryLine],
    token_count: int,
    provider: str,
    model: str,
    usage: dict[str, int],
    written_by: str | None = None,
    memory_keys: list[str] | None = None,
    folded_seqs: list[int] | None = None,
) -> bool:
    """Store a new summary version unless one already reaches as far (a concurrent run won),
    on the session's active branch (store/branches.py); a version that folded a message the
    active path no longer shows (the session switched while it was written) is stored off
    the path."""
    params = {
        "session_id": session_id,
        "through_seq": through_seq,
        "lines": Jsonb([line.as_json() for line in lines]),
        "token_count": token_count,
        "provider": provider,
        "model": model,
        "written_by": model if written_by is None else written_by,
        "input_tokens": int(usage.get("input_tokens", 0)),
        "output_tokens": int(usage.get("output_tokens", 0)),
        "memory_keys": Jsonb(list(memory_keys or [])),
        # NULL, not JSON's null: a version that records no seqs (see the model).
        "folded_seqs": None if folded_seqs is None else Jsonb(folded_seqs),
    }
    return bool(await db.run(_SAVE, params))


_SAVE = """
    INSERT INTO conversation_summaries (session_id, through_seq, lines, token_count, provider,
        model, written_by, input_tokens, output_tokens, memory_keys, folded_seqs, branch,
        off_path)
    VALUES (%(session_id)s, %(through_seq)s, %(lines)s, %(token_count)s, %(provider)s,
        %(model)s, %(written_by)s, %(input_tokens)s, %(output_tokens)s, %(memory_keys)s,
        %(folded_seqs)s, (SELECT branch FROM sessions WHERE id = CAST(%(session_id)s AS varchar)),
        EXISTS (SELECT 1 FROM messages WHERE session_id = %(session_id)s AND off_path
            AND CAST(%(folded_seqs)s AS jsonb) @> to_jsonb(seq)))
    ON CONFLICT ON CONSTRAINT uq_summary_through DO NOTHING
"""


async def folded_by(db: Db, *, session_id: str, through_seq: int) -> list[int]:
    """The seqs the session's version ending at `through_seq` folded (a version older than the
    record of them: every stored message up to its end)."""
    params = {"session_id": session_id, "through_seq": through_seq}
    recorded = await db.value(_FOLDED, params)
    if recorded is None:
        recorded = await db.value(_SEQS_THROUGH, params)
    return [int(seq) for seq in recorded]


_FOLDED = """
    SELECT folded_seqs FROM conversation_summaries
    WHERE session_id = %(session_id)s AND through_seq = %(through_seq)s AND NOT off_path
"""
_SEQS_THROUGH = """
    SELECT coalesce(array_agg(seq), '{}') FROM messages
    WHERE session_id = %(session_id)s AND seq <= %(through_seq)s AND NOT off_path
"""


@dataclass(frozen=True)
class Backlog:
    """What the rolling summary's check reads of a session: its tenant's configuration, the
    stored summary's end (0: none yet), and each message after it as stored, without its text:
    (seq, role, status, token count, the counter that made it, whether it shows anything)."""

    tenant_config: dict[str, Any]
    base: int
    messages: list[tuple[int, str, str, int | None, str | None, bool]]


async def summary_backlog(conn: Db, *, session_id: str) -> Backlog | None:
    """The session's messages past its summary, by their stored token counts, in one
    statement (None for a session that does not exist). A turn's check of whether the summary
    has work reads this instead of the messages themselves; a turn's ending reads it with its
    last statement (store/turns/endings.py `close_out_announced`)."""
    return parse_backlog(await conn.value(_BACKLOG_SQL, {"session_id": session_id}))


def parse_backlog(found: list[Any] | None) -> Backlog | None:
    """`BACKLOG_OF_SESSION`'s value as a `Backlog` (None: no such session)."""
    if found is None:
        return None
    config, base, rows = found
    messages = [(m[0], m[1], m[2], m[3], m[4], bool(m[5])) for m in rows]
    return Backlog(config or {}, base, messages)


# The backlog of the session `%(session_id)s` as one value, [tenant configuration, the
# summary's end, the messages], for a statement on a `Db`. "Shows anything" as
# `parley.window.group_turns` decides it: some text, or tool calls.
BACKLOG_OF_SESSION = """(
    SELECT json_build_array(t.config, coalesce(cs.through_seq, 0), coalesce((
        SELECT json_agg(json_build_array(
            m.seq, m.role, m.status, m.token_count, m.token_counter,
            coalesce(m.text, '') <> ''
            OR (jsonb_typeof(m.tool_calls) = 'array' AND m.tool_calls <> '[]'::jsonb)
        ) ORDER BY m.seq)
        FROM messages AS m
        WHERE m.session_id = s.id AND m.replaced_by IS NULL AND NOT m.off_path
          AND m.seq > coalesce(cs.through_seq, 0)
    ), '[]'))
    FROM sessions AS s
    LEFT JOIN tenants AS t ON t.id = s.tenant_id
    LEFT JOIN LATERAL (
        SELECT through_seq FROM conversation_summaries
        WHERE session_id = s.id AND NOT off_path ORDER BY through_seq DESC LIMIT 1
    ) AS cs ON true
    WHERE s.id = %(session_id)s
)"""
_BACKLOG_SQL = f"SELECT {BACKLOG_OF_SESSION} AS backlog"
