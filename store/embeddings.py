"""Message embeddings in PostgreSQL (pgvector), for recall by meaning.

The table exists only where the server has the `vector` extension (migration 0012); every
function here degrades to "nothing" without it, so recall falls back to full-text. Vectors go
in and out as pgvector's text form, so no client library for the type is needed.

Like every store module these never commit; the caller does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from parley.prompt import RecallHit
from parley.store.db import Db


@dataclass(frozen=True)
class Unembedded:
    message_id: str
    seq: int
    text: str


def vector_literal(values: Sequence[float]) -> str:
    return "[" + ",".join(f"{v:.6g}" for v in values) + "]"


async def available(db: Db) -> bool:
    """Whether this database can hold embeddings (the extension and the table are there)."""
    return bool(await db.value(_AVAILABLE, {}))


_AVAILABLE = "SELECT to_regclass('message_embeddings') IS NOT NULL"

# Databases seen to hold message vectors. Once the table is there it stays (no migration
# drops it): asked once per process, not per turn. Its absence is asked again, in case a
# migration adds it meanwhile.
_VECTORS_SEEN: set[str] = set()


async def available_once_seen(conn: Db) -> bool:
    """`available`, asked of each database only until it says yes."""
    if conn.database not in _VECTORS_SEEN and await available(conn):
        _VECTORS_SEEN.add(conn.database)
    return conn.database in _VECTORS_SEEN


async def unembedded(db: Db, *, session_id: str, model: str, limit: int) -> list[Unembedded]:
    """The session's searchable messages that have no vector of `model` yet, oldest first."""
    params = {"session_id": session_id, "model": model, "limit": limit}
    return await db.rows(_UNEMBEDDED, params, Unembedded)


_UNEMBEDDED = """
    SELECT m.id AS message_id, m.seq, m.text FROM messages m
    WHERE m.session_id = %(session_id)s AND m.replaced_by IS NULL AND NOT m.off_path
      AND m.role IN ('user', 'assistant') AND m.status <> 'retracted' AND m.text <> ''
      AND NOT EXISTS (
          SELECT 1 FROM message_embeddings e WHERE e.message_id = m.id AND e.model = %(model)s
      )
    ORDER BY m.seq
    LIMIT %(limit)s
"""


async def save_embeddings(
    db: Db,
    *,
    session_id: str,
    model: str,
    items: Sequence[tuple[Unembedded, Sequence[float]]],
) -> None:
    """Store vectors, in one statement; a message another run already embedded keeps its
    vector."""
    if not items:
        return
    params = {
        "model": model,
        "session_id": session_id,
        "ids": [message.message_id for message, _ in items],
        "seqs": [message.seq for message, _ in items],
        "vectors": [vector_literal(vector) for _, vector in items],
    }
    await db.run(_SAVE, params)


_SAVE = """
    INSERT INTO message_embeddings (message_id, model, session_id, seq, embedding)
    SELECT item.message_id, %(model)s, %(session_id)s, item.seq, CAST(item.embedding AS vector)
    FROM unnest(CAST(%(ids)s AS text[]), CAST(%(seqs)s AS integer[]),
        CAST(%(vectors)s AS text[])) AS item(message_id, seq, embedding)
    ON CONFLICT (message_id, model) DO NOTHING
"""


async def nearest(
    conn: Db,
    *,
    session_id: str,
    model: str,
    query: Sequence[float],
    before_seq: int,
    limit: int,
) -> list[int]:
    """Seqs of the session's messages before `before_seq` closest in meaning to `query`
    (cosine distance), best first."""
    params = {
        "session_id": session_id,
        "model": model,
        "before": before_seq,
        "query": vector_literal(query),
        "limit": limit,
    }
    return [int(r.seq) for r in await conn.rows(_NEAREST, params, _Seq)]


_NEAREST = """
    SELECT e.seq FROM message_embeddings e JOIN messages m ON m.id = e.message_id
    WHERE e.session_id = %(session_id)s AND e.model = %(model)s AND e.seq < %(before)s
      AND m.replaced_by IS NULL AND NOT m.off_path AND m.status <> 'retracted'
    ORDER BY e.embedding <=> CAST(%(query)s AS vector), e.seq DESC
    LIMIT %(limit)s
"""


@dataclass(frozen=True)
class _Seq:
    seq: int


async def hits_for(conn: Db, *, session_id: str, seqs: Sequence[int]) -> list[RecallHit]:
    """Recall lines for the given seqs, in the order given; only messages recall may show
    (a user's or assistant's words, not replaced, not retracted, not empty)."""
    if not seqs:
        return []
    params = {"session_id": session_id, "seqs": list(seqs)}
    by_seq = {
        m.seq: RecallHit(m.seq, m.role, m.text, m.created_at.date().isoformat())
        for m in await conn.rows(_HITS, params, _Hit)
    }
    return [by_seq[s] for s in seqs if s in by_seq]


_HITS = """
    SELECT seq, role, text, created_at FROM messages
    WHERE session_id = %(session_id)s AND seq = ANY(%(seqs)s) AND replaced_by IS NULL
        AND NOT off_path
      AND role IN ('user', 'assistant') AND status <> 'retracted' AND text <> ''
"""


@dataclass(frozen=True)
class _Hit:
    seq: int
    role: str
    text: str
    created_at: datetime
