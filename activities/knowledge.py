"""The activity side of knowledge: the prompt's passages for a turn, and its citations.

The context builder uses it in two calls. `KnowledgeSource.search` rewrites the message into a
standalone query and searches the tenant's documents (full-text; with an embedder configured,
vectors too, fused by reciprocal rank) on a connection of its own, in autocommit: it runs
side by side with the build's other reads (the builder starts it first and reads it last),
and a search that fails cannot spoil the build's transaction. `KnowledgeSource.blocks` then
fills the knowledge budget and shapes one prompt block, in the build's transaction. A search
that fails degrades the turn (a `warning`, no passages or full-text only); a turn whose user
is not a member of its tenant stops (`forbidden`) before any search: knowledge is never
searched on behalf of someone the tenant does not know.

`emit_citations` (called by finalize) turns the references an answer cites into the
`citations` event, just before `done`.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

from temporalio.exceptions import ApplicationError

from parley.context import Block, Position
from parley.contracts import TERMINAL_TURN_STATES, EventType, WarningCode
from parley.gateway.embeddings import Embedder, EmbeddingError
from parley.knowledge import (
    Passage,
    cited_sources,
    fuse,
    knowledge_text,
    query_terms,
    select_passages,
    standalone_query,
)
from parley.statuses import TurnErrorCode
from parley.store import knowledge as knowledge_store
from parley.store.db import Database, Db, StoreError, connect
from parley.store.events import append_event, warn_once
from parley.store.steps import CallRow
from parley.store.turns.reads import TurnFacts, TurnRow
from parley.tokens import TokenCounter, count_message
from parley.wire import CitationsData, CitationSource, WarningData

log = logging.getLogger(__name__)

KNOWLEDGE_UNAVAILABLE = WarningCode.knowledge_unavailable
SEARCH_FAILED = "I could not search our policy documents for this answer."
VECTORS_FAILED = "Semantic search of our documents was unavailable."
# Between the pasted chunks (60) and the summary (70): a policy answer needs its passages.
KNOWLEDGE_PRIORITY = 65


@dataclass(frozen=True)
class Found:
    passages: list[Passage]
    method: str  # "fts", "hybrid", or "none" when the search failed


@dataclass(frozen=True)
class Searched:
    """What `KnowledgeSource.search` found for one message."""

    query: str
    always: list[Passage]  # the always-documents' passages, shown whatever the search does
    found: Found
    # Set when a search failed: the warning the build's stream shows (the answer degrades).
    warning: str | None = None


class KnowledgeSource:
    """Built in worker.py with the settings' limits and the configured embedder (if any)."""

    def __init__(self, *, passages: int, embedder: Embedder | None = None) -> None:
        self._limit = passages
        self._embedder = embedder
        # Once the vector column is seen it stays (no migration drops it): asked per process,
        # not per turn. Its absence is asked again, in case a migration adds it meanwhile.
        self._vectors_seen = False

    async def search(
        self,
        sessions: Database,
        turn: TurnFacts,
        *,
        message: str,
        slots: dict[str, Any],
    ) -> Searched:
        """The passages for this message, searched on a connection of `sessions`' pool in
        autocommit (reads only). The caller has `authorize`d the turn."""
        query = standalone_query(message, slots=slots)
        async with connect(sessions) as aside:
            return await self._search(aside, turn, query)

    async def blocks(
        self,
        db: Db,
        turn: TurnFacts,
        searched: Searched,
        *,
        counter: TokenCounter,
        budget: int,
    ) -> tuple[list[Block], dict[str, Any]]:
        """The knowledge block for this step (none when nothing matched), and the record
        the stored request keeps (query, method, the sources shown by reference); a failed
        search's warning goes to the stream here, in the build's transaction."""
        if searched.warning is not None:
            await _warn(db, turn, searched.warning)
        selection = select_passages(
            searched.always, searched.found.passages, budget=budget, count=counter.count
        )
        record: dict[str, Any] = {
            "query": searched.query,
            "method": searched.found.method,
            "sources": selection.sources,
            "left_out": selection.left_out,
            "truncated": selection.truncated,
        }
        if not selection.passages and not selection.left_out:
            return [], record
        content = {"role": "system", "content": knowledge_text(selection)}
        block = Block(
            "knowledge",
            "knowledge passages",
            (content,),
            count_message(counter, content),
            Position.recall,
            priority=KNOWLEDGE_PRIORITY,
            order=-1,  # before recalled messages
        )
        return [block], record

    async def _search(self, db: Db, turn: TurnFacts, query: str) -> Searched:
        """The always-documents' passages and what the search found, on a session in
        autocommit (a failed statement spoils nothing). With an embedder, the query's
        embedding (a request to the embedding server) runs while the text search does."""
        terms = query_terms(query)
        embedding = None
        if self._embedder is not None and await self._has_vectors(db):
            embedding = asyncio.create_task(self._embedder.embed([query]))
        try:
            try:
                # One statement for both (the always-documents read again on their own
                # below when it fails: they are shown whatever the search does).
                always, text_hits = await knowledge_store.always_and_search_text(
                    db, tenant_id=turn.tenant_id, terms=terms, limit=self._limit * 2
                )
            except StoreError:
                log.warning("knowledge search failed", exc_info=True)
                always = await knowledge_store.always_passages(db, tenant_id=turn.tenant_id)
                return Searched(query, always, Found([], "none"), SEARCH_FAILED)
            vector_hits = (
                None if embedding is None else await self._vector_search(db, turn, embedding)
            )
        finally:
            if embedding is not None and not embedding.done():
                embedding.cancel()
        if vector_hits is None:
            warning = None if embedding is None else VECTORS_FAILED
            return Searched(query, always, Found(text_hits[: self._limit], "fts"), warning)
        by_key = {p.key: p for p in [*text_hits, *vector_hits]}
        fused = fuse([[p.key for p in text_hits], [p.key for p in vector_hits]])
        return Searched(query, always, Found([by_key[k] for k in fused[: self._limit]], "hybrid"))

    async def _has_vectors(self, db: Db) -> bool:
        if not self._vectors_seen:
            self._vectors_seen = await knowledge_store.has_vectors(db)
        return self._vectors_seen

    async def _vector_search(
        self, db: Db, turn: TurnFacts, embedding: asyncio.Task[list[list[float]]]
    ) -> list[Passage] | None:
        """Nearest chunks to the query's embedding; None on a failure (the answer then rests
        on full-text search alone, with a warning)."""
        assert self._embedder is not None
        try:
            [vector] = await embedding
            return await knowledge_store.search_vector(
                db,
                tenant_id=turn.tenant_id,
                model=self._embedder.model,
                vector=vector,
                limit=self._limit * 2,
            )
        except (EmbeddingError, StoreError):
            log.warning("knowledge vector search failed", exc_info=True)
            return None


def authorize(turn: TurnFacts, *, user_known: bool, session_tenant: str | None) -> None:
    """The turn's user must be a member of the tenant whose documents are searched, and the
    session must belong to that tenant (as the build read them); otherwise the turn stops."""
    if not user_known or session_tenant != turn.tenant_id:
        raise ApplicationError(
            "not authorized to read this tenant's knowledge",
            type=TurnErrorCode.forbidden,
            non_retryable=True,
        )


async def _warn(db: Db, turn: TurnFacts, message: str) -> None:
    """One warning per turn, however many steps search."""
    data = WarningData(code=KNOWLEDGE_UNAVAILABLE, message=message)
    await warn_once(db, turn_id=turn.id, data=data)


async def emit_citations(
    conn: Db, *, turn: TurnRow, call: CallRow, message_id: str, text: str
) -> None:
    """Append `citations` for the passages the answer cites (nothing when it cites none);
    once: a finalize retried after its commit finds the turn ended and adds nothing.
    `turn` and `call` as finalize read them, the turn locked."""
    if turn.state in TERMINAL_TURN_STATES:
        return
    # A request without passages records none (or no "knowledge" at all: older calls).
    shown = ((call.request or {}).get("knowledge") or {}).get("sources") or []
    sources = cited_sources(text, shown)
    if not sources:
        return
    await append_event(
        conn,
        turn_id=turn.id,
        type=EventType.citations,
        data=CitationsData(
            message_id=message_id,
            sources=[CitationSource.model_validate(s) for s in sources],
        ),
    )
