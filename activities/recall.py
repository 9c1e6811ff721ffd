"""Recall for the context builder: full-text search, fused with recall by meaning when an
embedder is configured (parley/recall.py), and the indexing of messages for it.

Message vectors are computed off the turn's critical path, by the summary workflow's activity
(`embed_pending`, called from `MemoryActivities.summarize`); a turn embeds only its own
question. Messages not embedded yet are recent ones, which the window shows anyway, and
full-text search still finds them. Without the extra, the weights or the `vector` extension,
recall is full-text alone.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from gateway.minilm import Embedder
from parley.prompt import RecallHit
from parley.recall import CANDIDATES, with_neighbours
from store import embeddings as embedding_store
from store import memory as memory_store

log = logging.getLogger(__name__)

# Messages embedded per summary run: a long backlog is spread over a few runs, well within
# the activity's timeout (about 25 ms a message on one core).
EMBED_BATCH = 256


@dataclass(frozen=True)
class RecallQuery:
    terms: list[str]  # full-text terms (parley/memory.py `recall_terms`)
    question: str  # the current message, embedded as it stands
    embedder: Embedder | None = None  # None: full-text only


async def recall_hits(
    db: AsyncSession, query: RecallQuery, *, session_id: str, before_seq: int, limit: int
) -> list[RecallHit]:
    """The older messages most relevant to the question, best first: full-text, fused with
    the nearest in meaning when an embedder is configured, and with the neighbours of the best
    of those (twice `limit` candidates, since many lines are short; the recall block takes
    what its budget holds)."""
    terms, embedder = query.terms, query.embedder
    if before_seq <= 1:
        return []
    lexical = await memory_store.recall(
        db, session_id=session_id, terms=terms, before_seq=before_seq, limit=CANDIDATES
    )
    rankings = [[h.seq for h in lexical]]
    if embedder is not None and await embedding_store.available(db):
        (vector,) = await asyncio.to_thread(embedder.embed, [query.question])
        dense = await embedding_store.nearest(
            db,
            session_id=session_id,
            model=embedder.name,
            query=vector,
            before_seq=before_seq,
            limit=CANDIDATES,
        )
        rankings.append(dense)
    fused = with_neighbours(rankings, below=before_seq)[: limit * 2]
    known = {h.seq: h for h in lexical}
    missing = [s for s in fused if s not in known]
    for hit in await embedding_store.hits_for(db, session_id=session_id, seqs=missing):
        known[hit.seq] = hit
    return [known[s] for s in fused if s in known]


async def embed_pending(
    sessions: async_sessionmaker[AsyncSession],
    embedder: Embedder,
    *,
    session_id: str,
    batch: int = EMBED_BATCH,
) -> int:
    """Embed up to `batch` of the session's messages that have no vector yet; returns how
    many were stored (0: nothing to do, or no `vector` extension)."""
    async with sessions() as db:
        if not await embedding_store.available(db):
            return 0
        todo = await embedding_store.unembedded(
            db, session_id=session_id, model=embedder.name, limit=batch
        )
    if not todo:
        return 0
    # The forward pass is CPU work: off the event loop, so heartbeats and others go on.
    vectors = await asyncio.to_thread(embedder.embed, [m.text for m in todo])
    async with sessions() as db:
        await embedding_store.save_embeddings(
            db,
            session_id=session_id,
            model=embedder.name,
            items=list(zip(todo, vectors, strict=True)),
        )
        await db.commit()
    return len(todo)
