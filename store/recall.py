"""Recall's full-text search (activities/recall.py): the session's older messages that match
the question's terms, ranked, with the lines around the best of them, in one statement."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime

from parley.periods import Period
from parley.prompt import RecallHit
from parley.store.db import Db

_TERM = re.compile(r"[^a-z0-9]")

# Each matching term scores its inverse document frequency within the session's messages, so
# a name said in every message counts for little and a rare word for much; a message that is
# one question and nothing else scores half (it asks, it tells nothing: its answer is what
# recall is after, and a user who asks again shares its words). A text said more
# than once in the session (an assistant's canned reply) is never a candidate nor a
# neighbour; of a user's repeated text, its newest copy is. The same statement returns,
# after the ranked hits (`rank` from 1), the searchable messages within two places of the
# best `top` of them (`rank` NULL): the neighbours recall adds (parley/recall.py
# `with_neighbours`) come with the search instead of by a read of their own. The best hit's
# row also carries the seqs of every searchable message (`order`), so that recall can find
# the neighbours of any hit, however many texts between them were left out. When the question
# names a period (`since`, `until`: parley/periods.py), the hits said in it rank first.
_RECALL_SQL = """
    WITH shown AS (
        SELECT seq, role, text, created_at, tsv,
               count(*) OVER (PARTITION BY text) AS copies,
               max(seq) OVER (PARTITION BY text) AS newest
        FROM messages
        WHERE session_id = %(session_id)s AND replaced_by IS NULL AND NOT off_path
          AND role IN ('user', 'assistant') AND status <> 'retracted' AND text <> ''
    ),
    docs AS (
        SELECT seq, role, text, created_at, tsv, row_number() OVER (ORDER BY seq) AS pos
        FROM shown
        WHERE seq < %(before)s AND (copies = 1 OR (role = 'user' AND seq = newest))
    ),
    q AS (
        SELECT t, to_tsquery('english', t) AS query
        FROM unnest(CAST(%(terms)s AS text[])) AS t
        WHERE numnode(to_tsquery('english', t)) > 0
    ),
    total AS (SELECT count(*) AS n FROM docs),
    df AS (
        SELECT q.t, q.query, count(docs.seq) AS n
        FROM q LEFT JOIN docs ON docs.tsv @@ q.query GROUP BY q.t, q.query
    ),
    ranked AS (
        SELECT docs.seq, docs.role, docs.text, docs.created_at, docs.pos,
               sum(ln((total.n + 1.0) / (df.n + 0.5)))
                 * CASE WHEN docs.text ~ '^[^.!?]*[?][[:space:]]*$' THEN 0.5 ELSE 1 END AS score
        FROM docs JOIN df ON docs.tsv @@ df.query CROSS JOIN total
        GROUP BY docs.seq, docs.role, docs.text, docs.created_at, docs.pos
        ORDER BY (CAST(docs.created_at AS date) BETWEEN %(since)s AND %(until)s) DESC NULLS LAST,
                 score DESC, docs.seq DESC
        LIMIT %(limit)s
    ),
    numbered AS (
        SELECT seq, role, text, created_at, pos,
               row_number() OVER (
                   ORDER BY (CAST(created_at AS date) BETWEEN %(since)s AND %(until)s)
                       DESC NULLS LAST, score DESC, seq DESC
               ) AS rank
        FROM ranked
    )
    SELECT seq, role, text, created_at, rank,
           CASE WHEN rank = 1 THEN (SELECT array_agg(seq ORDER BY seq) FROM docs) END AS "order"
    FROM numbered
    UNION ALL
    SELECT docs.seq, docs.role, docs.text, docs.created_at, NULL, NULL FROM docs
    WHERE docs.seq NOT IN (SELECT seq FROM numbered)
      AND EXISTS (
        SELECT 1 FROM numbered
        WHERE numbered.rank <= %(top)s AND abs(numbered.pos - docs.pos) <= 2
      )
    ORDER BY rank NULLS LAST, seq
"""


@dataclass(frozen=True)
class Recalled:
    """What the search found: the ranked hits (best first), the searchable messages within
    two places of the best of them, and the seqs of every searchable message (empty when
    nothing matched: neighbours are then found by seq)."""

    ranked: list[RecallHit]
    near: list[RecallHit]
    order: list[int]


async def recall(
    db: Db,
    *,
    session_id: str,
    terms: list[str],
    before_seq: int,
    limit: int = 8,
    top: int = 0,
    period: Period | None = None,
) -> Recalled:
    """The older messages (before `before_seq`) that best match `terms`, best first, the
    searchable messages within two places of the best `top` of those (none with `top` 0),
    and the order of every searchable message."""
    clean = [t for t in (_TERM.sub("", term.lower()) for term in terms) if t]
    if not clean or before_seq <= 1:
        return Recalled([], [], [])
    params = {
        "terms": clean,
        "session_id": session_id,
        "before": before_seq,
        "limit": limit,
        "top": top,
        "since": period[0] if period else None,
        "until": period[1] if period else None,
    }
    found = Recalled([], [], [])
    for r in await db.rows(_RECALL_SQL, params, _Line):
        hit = RecallHit(r.seq, r.role, r.text, r.created_at.date().isoformat())
        (found.near if r.rank is None else found.ranked).append(hit)
        if r.order is not None:
            found.order.extend(r.order)
    return found


@dataclass(frozen=True)
class _Line:
    seq: int
    role: str
    text: str
    created_at: datetime
    rank: int | None
    order: list[int] | None
