"""Recall for the context builder: whether it runs at all (not while the window holds the
whole conversation), how the window and the recalled lines share the conversation budget,
full-text search fused with recall by meaning when an embedder is configured
(parley/recall.py), and the indexing of messages for it.

Message vectors are computed off the turn's critical path, after its answer is stored, and
only once recall may search the session (activities/indexing.py: when, and by whom; both
embed with `embed_pending`). A turn's
build embeds only its question, and only when recall runs at all (the context builder skips
it while the window holds the whole conversation) and the question reaches back past the
last turns: a follow-up about them (most turns of a chat) is searched by its words, which
the recent turns share, with no embedding on its path. The embedding is CPU work, so it
runs in a thread, started before the build's remaining reads (`RecallQuery.start`), which
the database answers meanwhile. Messages not embedded yet are those of a conversation the
window holds whole, or of a turn just ended, which the window shows anyway; full-text search
finds them all. Without the extra, the weights or the `vector` extension,
recall is full-text alone.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, replace
from typing import Any

from parley.activities import tracing
from parley.activities.embedding_batches import batches as embedding_batches
from parley.activities.metrics import RECALLS
from parley.budget import RECENT_TURNS, BudgetRule, reaches_back
from parley.config import Settings
from parley.context import Block, WindowMessage
from parley.gateway.minilm import Embedder
from parley.periods import Period, in_period
from parley.prompt import Budgets, Fold, Memory, RecallHit, fold_block, plan_window, recall_block
from parley.recall import (
    CANDIDATES,
    NEIGHBOUR_TOP,
    rounds_for,
    said,
    with_neighbours,
    without_speakers,
)
from parley.store import embeddings as embedding_store
from parley.store import memory as memory_store
from parley.store import recall as recall_store
from parley.store.context import SessionFacts, remembered_tokens
from parley.store.db import Database, Db, connect
from parley.store.turns.reads import TurnFacts
from parley.tenancy import TenantConfig
from parley.tokens import TokenCounter
from parley.window import Window, turn_tokens

log = logging.getLogger(__name__)

# Messages embedded per summary run: a long backlog is spread over a few runs, well within
# the activity's timeout (about 25 ms a message on one core).
EMBED_BATCH = 256


@dataclass(frozen=True)
class RecallQuery:
    terms: list[str]  # full-text terms (parley/memory.py `recall_terms`)
    question: str  # the current message, embedded as it stands
    embedder: Embedder | None = None  # None: full-text only
    # The question's embedding, running in a thread (`start`); None: not started.
    vector: asyncio.Task[list[list[float]]] | None = None
    # The days the question names ("in March 2023", "last week"; parley/periods.py), whose
    # lines recall shows first; None: it names none.
    period: Period | None = None
    # Whether the question reaches back past the last turns (parley/budget.py
    # `reaches_back`; `start_recall` decides): False, a follow-up, is searched by its words
    # alone, its recall share the follow-up's.
    reaches_back: bool = True

    async def start(self, db: Db) -> RecallQuery:
        """This query with its embedding under way, when it reaches back, there is an
        embedder and the database holds vectors to compare it with (else as it is): the
        forward pass is CPU work, so it runs in a thread while the caller's next statements
        wait on the database. The caller awaits it through `recall_hits`, or `cancel`s it."""
        if (
            self.embedder is None
            or self.vector is not None
            or not self.reaches_back
            or not await embedding_store.available_once_seen(db)
        ):
            return self
        task = asyncio.create_task(asyncio.to_thread(self.embedder.embed, [self.question]))
        return replace(self, vector=task)

    def cancel(self) -> None:
        """Drop an embedding nobody will read (the thread finishes on its own)."""
        if self.vector is not None and not self.vector.done():
            self.vector.cancel()

    @property
    def method(self) -> str:
        """What the search will be: full-text alone, or fused with recall by meaning."""
        return "fts" if self.vector is None else "hybrid"


async def recall_hits(
    db: Db,
    query: RecallQuery,
    *,
    session_id: str,
    before_seq: int,
    limit: int,
    budget: int = 0,
) -> list[RecallHit]:
    """The older messages most relevant to the question, best first: full-text, fused with
    the nearest in meaning when an embedder is configured, and with the neighbours of the best
    of those (twice `limit` candidates, since many lines are short; the recall block takes
    what its budget holds). The question's embedding (`RecallQuery.start`, started here if
    the caller has not) runs while the full-text search does."""
    if before_seq <= 1:
        query.cancel()
        return []
    query = await query.start(db)
    try:
        found = await recall_store.recall(
            db,
            session_id=session_id,
            terms=query.terms,
            before_seq=before_seq,
            limit=CANDIDATES,
            top=NEIGHBOUR_TOP,
            period=query.period,
        )
        lexical, near = found.ranked, found.near
        rankings = [[h.seq for h in lexical]]
        if query.vector is not None and query.embedder is not None:
            (vector,) = await query.vector
            dense = await embedding_store.nearest(
                db,
                session_id=session_id,
                model=query.embedder.name,
                query=vector,
                before_seq=before_seq,
                limit=CANDIDATES,
            )
            rankings.append(dense)
    finally:
        query.cancel()
    fused = with_neighbours(
        rankings, below=before_seq, rounds=rounds_for(budget), order=found.order
    )[: limit * 2]
    # The search brought every line recall may show within two places of its best hits (a
    # seq there that it did not bring is not one to show); only what recall by meaning and
    # further rounds of neighbours found beyond them is read here.
    known = {h.seq: h for h in [*near, *lexical]}
    searched = _within_two(lexical[:NEIGHBOUR_TOP], found.order)
    missing = [s for s in fused if s not in known and s not in searched]
    for hit in await embedding_store.hits_for(db, session_id=session_id, seqs=missing):
        known[hit.seq] = hit
    hits = [known[s] for s in fused if s in known]
    if query.period is None:
        return hits
    period = query.period
    return sorted(hits, key=lambda h: not in_period(h.date, period))  # stable: then by rank


async def sized(
    budgets: Budgets,
    configured: tuple[Settings, TenantConfig],
    session: tuple[Db, TurnFacts, SessionFacts | None],
) -> Budgets:
    """`budgets` with the conversation's share sized to what there is to remember (the
    session's distinct text, as the build read it with the turn or read here), and recall's
    share of it for a follow-up and for a question that reaches back (parley/budget.py;
    `reaching_back` picks one, once recall is known to run)."""
    remembered = await remembered_tokens(*session)
    rule = budget_rule(budgets, *configured)
    conversation = rule.conversation(remembered)
    return replace(
        budgets,
        conversation=conversation,
        recall=rule.recall(conversation, reaches_back=False),
        recall_reaching_back=rule.recall(conversation, reaches_back=True),
    )


def budget_rule(budgets: Budgets, settings: Settings, tenant: TenantConfig) -> BudgetRule:
    """The conversation budget's rule as configured: the floor and recall's split at it from
    `budgets`, the share, ceiling and reach-back split from the settings and the tenant's
    overrides."""
    ceiling = tenant.context_conversation_max_tokens or settings.context_conversation_max_tokens
    share = tenant.context_conversation_share
    return BudgetRule(
        floor=budgets.conversation,
        ceiling=max(budgets.conversation, ceiling),
        share=settings.context_conversation_share if share is None else share,
        recall_at_floor=budgets.recall,
        reach_back_recall=settings.context_recall_reach_back_share,
    )


def candidate_limit(recall_tokens: int) -> int:
    """How many candidates recall asks its searches for: as many lines as its tokens could
    show (about 40 tokens a line), at least 8."""
    return max(8, recall_tokens // 40)


def asks_back(terms: list[str], history: list[list[WindowMessage]]) -> bool:
    """Whether a question with these terms reaches back past the last turns of `history`
    (parley/budget.py `reaches_back`). Asked only when recall runs (reading the loaded
    messages' words costs a couple of milliseconds on a long session)."""
    recent = [(m.role, m.text) for turn in history[-RECENT_TURNS:] for m in turn if m.text]
    earlier = [m.text for turn in history for m in turn if m.text]  # as loaded
    return reaches_back(terms, recent, earlier)


def reaching_back(budgets: Budgets, query: RecallQuery) -> Budgets:
    """`budgets` with recall's share for this question: most of the conversation's when it
    reaches back past the last turns, the follow-up's otherwise."""
    if budgets.recall_reaching_back <= budgets.recall or not query.reaches_back:
        return budgets
    return replace(budgets, recall=budgets.recall_reaching_back)


def _within_two(hits: list[RecallHit], order: list[int]) -> set[int]:
    """The seqs the search returned as neighbours: within two places of these hits (in
    `order`, or by seq without one)."""
    if not order:
        return {h.seq + d for h in hits for d in range(-2, 3)}
    place = {seq: i for i, seq in enumerate(order)}
    return {
        order[i]
        for h in hits
        if h.seq in place
        for i in range(place[h.seq] - 2, place[h.seq] + 3)
        if 0 <= i < len(order)
    }


def holds_everything(window: Window, turn: TurnFacts) -> bool:
    """Whether the window holds the session from its first message (seqs are dense from 1):
    recall, which searches the messages before the window, could only find lines the prompt
    shows whole. A session whose first message the window does not show (retracted, or
    empty) is searched as before."""
    return (window.from_seq or turn.user_seq) <= 1


def cancel(query: RecallQuery | None) -> None:
    """Drop the query's embedding, if any, when nobody will read it."""
    if query is not None:
        query.cancel()


async def start_recall(
    db: Db,
    turn: TurnFacts,
    whole: Window,
    history: list[list[WindowMessage]],
    query: RecallQuery,
) -> RecallQuery | None:
    """No recall (None) when the `whole` window holds the conversation: nothing to search,
    nothing to embed. Else `query`, knowing whether it reaches back past the last turns of
    `history`: when it does, its embedding is started in a thread so that it runs while the
    build's other reads do (recall awaits it last); a follow-up is searched by its words
    alone, with no embedding on the build's path (the recent turns it asks about share its
    words; recall's share for it is the follow-up's, a few lines)."""
    if holds_everything(whole, turn):
        return None
    query = replace(query, reaches_back=asks_back(query.terms, history))
    if query.reaches_back and query.embedder is not None:
        # Embedded without the names of the session's speakers (lines are embedded without
        # their labels): read only for a question that will be embedded, not on every build.
        names = await memory_store.speakers(
            db, session_id=turn.session_id, before_seq=turn.user_seq
        )
        query = replace(query, question=without_speakers(query.question, names))
    return await query.start(db)


async def window_and_recall(
    db: Db,
    turn: TurnFacts,
    history: list[list[WindowMessage]],
    memory: Memory,
    budgets: Budgets,
    counter: TokenCounter,
    *,
    left: int,
    whole: Window,
    query: RecallQuery | None,
) -> tuple[Window, Fold, list[Block], list[RecallHit]]:
    """The recent window, the folded gap and the recalled lines, sharing what the memory
    blocks left: the `whole` window (all of `left`) with no recall when there is no `query`
    (it holds the whole conversation, so there is no gap either).

    Otherwise first with the recall budget held back. A gap between the summary and that
    window (the summary lags, or failed) is folded by code within the summary's budget, taken
    from the window's share (the window then starts a little later, and its first turns join
    the fold). Then the recent turns take what the recalled lines left over (never fewer
    turns, so recall only loses lines the window now shows, and the fold only turns it now
    shows)."""
    if query is None:
        return whole, fold_block(counter, whole, memory, max_tokens=budgets.summary), [], []
    budgets = reaching_back(budgets, query)
    first = plan_window(history, memory, recent=left - budgets.recall)
    folded = fold_block(counter, first, memory, max_tokens=budgets.summary)
    fold_tokens = sum(b.tokens for b in folded.blocks)
    if fold_tokens:  # the fold's share comes out of the window's, not recall's
        first = plan_window(history, memory, recent=left - budgets.recall - fold_tokens)
        folded = fold_block(counter, first, memory, max_tokens=budgets.summary)
        fold_tokens = sum(b.tokens for b in folded.blocks)
    # Recall gets its budget, or what the window and the fold leave when the window's one
    # turn is over its share.
    room = left - sum(turn_tokens(t) for t in first.turns) - fold_tokens
    recall_budgets = replace(budgets, recall=max(0, min(budgets.recall, room)))
    hits = await recall_hits(
        db,
        query,
        session_id=turn.session_id,
        before_seq=first.from_seq or turn.user_seq,
        limit=candidate_limit(recall_budgets.recall),
        budget=recall_budgets.recall,
    )
    recalled = recall_block(counter, hits, recall_budgets)
    taken = fold_tokens + sum(b.tokens for b in recalled)
    window = plan_window(history, memory, recent=left - taken)
    if window.from_seq is not None and window.from_seq != first.from_seq:
        hits = [h for h in hits if h.seq < window.from_seq]
        recalled = recall_block(counter, hits, recall_budgets)
        if folded.from_seq is not None:  # the same share, for what is still left between
            folded = fold_block(counter, window, memory, max_tokens=fold_tokens)
    return window, folded, recalled, hits


def window_plan(
    window: Window, through: int | None, method: str, hits: list[RecallHit], folded: Fold
) -> dict[str, Any]:
    """Where the window starts, what was folded between it and the summary, and what recall
    added, as the stored request records it."""
    return {
        "window_from_seq": window.from_seq,
        "summary_through_seq": through,
        # The turns between the summary and the window, condensed by code (None: none).
        "folded": {
            "from_seq": folded.from_seq,
            "through_seq": folded.through_seq,
            "lines": folded.lines,
        }
        if folded.from_seq is not None
        else None,
        "recall": method,
        "recalled_seqs": sorted(h.seq for h in hits),
    }


def recalled_by(query: RecallQuery | None) -> str:
    """What recall did for this prompt, counted and on the build's span: "skipped" (the
    window holds the whole conversation), "fts" or "hybrid"."""
    method = "skipped" if query is None else query.method
    RECALLS.labels(method).inc()
    tracing.annotate(recall=method)
    return method


async def embed_pending(
    sessions: Database,
    embedder: Embedder,
    *,
    session_id: str,
    batch: int = EMBED_BATCH,
) -> int:
    """Embed up to `batch` of the session's messages that have no vector yet; returns how
    many were stored (0: nothing to do, or no `vector` extension)."""
    async with connect(sessions) as conn:  # in autocommit: one statement
        if not await embedding_store.available_once_seen(conn):
            return 0
        todo = await embedding_store.unembedded(
            conn, session_id=session_id, model=embedder.name, limit=batch
        )
    if not todo:
        return 0
    # The forward pass is CPU work: off the event loop, on one thread of its own, and shared
    # with the other sessions' runs asking at the same time (activities/embedding_batches.py).
    texts = [said(m.text) for m in todo]  # what each says, not who says it
    vectors = await embedding_batches().embed(embedder, texts)
    async with connect(sessions) as conn:  # one statement, in autocommit
        await embedding_store.save_embeddings(
            conn,
            session_id=session_id,
            model=embedder.name,
            items=list(zip(todo, vectors, strict=True)),
        )
    return len(todo)
