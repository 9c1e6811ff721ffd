"""A context build costs what the conversation needs: while the recent window holds the whole
conversation, recall neither searches nor embeds the question (and the prompt still shows
every message); once it does not, recall by words and by meaning still finds an old fact, and
a follow-up about the last turns is searched by its words without embedding it.

Through the whole stack (API, Temporal, a worker with the local MiniLM embedder, PostgreSQL),
read where an operator reads it: the stored request, the build's span, the worker's
`parley_context_recall_total` counter, and the statements the worker sent."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from typing import Any

import pytest_asyncio
from prometheus_client import REGISTRY
from sqlalchemy import select
from temporalio.client import Client

from parley.activities.memory import MemoryActivities
from parley.config import Settings
from parley.gateway.demo import DemoModel
from parley.gateway.minilm import MiniLMEmbedder
from parley.gateway.registry import ProviderPool
from parley.memory import recall_terms
from parley.prompt import CONVERSATION_KINDS
from parley.store import recall as recall_store
from parley.store.db import Database
from parley.store.models import ConversationSummary, TraceSpan
from tests.support.client import ParleyClient
from tests.support.orm import add_transcript, orm
from tests.support.toolkit import Stack, counted_sessions, model_calls, own_stack

FACT = "My gym locker code is 4417, please keep it in mind."
QUESTION = "What is my gym locker code?"
# What the worker sends when recall runs: the full-text search (store/recall.py) and the
# nearest messages by meaning (store/embeddings.py).
RECALL_SEARCH = "WITH shown AS ("
NEAREST = "SELECT e.seq FROM message_embeddings"


@pytest_asyncio.fixture
async def counted(
    database_url: str,
) -> AsyncIterator[tuple[Database, list[str]]]:
    """An engine for the worker, every statement it sends recorded."""
    async with counted_sessions(database_url) as recorded:
        yield recorded


def recall_stack(
    temporal_client: Client,
    settings: Settings,
    worker_sessions: Database,
    prefix: str,
) -> AbstractAsyncContextManager[Stack[DemoModel]]:
    """A stack whose worker recalls by words and meaning (MiniLM), with a conversation
    budget of 600 tokens of which recall holds 200."""
    return own_stack(
        temporal_client,
        settings,
        worker_sessions,
        DemoModel(token_delay_s=0),
        prefix=prefix,
        embeddings="local-minilm",
        context_conversation_tokens=600,
        context_recall_tokens=200,
    )


async def seed(sessions: Database, session_id: str, texts: list[str], *, summary: int) -> None:
    """A transcript as earlier turns would have stored it (seq 1..n, user then assistant),
    and a rolling summary of it through seq `summary` that kept nothing of the fact."""
    async with orm(sessions) as db:
        db.add(
            ConversationSummary(
                session_id=session_id,
                through_seq=summary,
                lines=[{"seq": 3, "text": "The user asked about trail runner sizes.", "refs": {}}],
                token_count=12,
                provider="demo",
                model="demo-1",
            )
        )
        await add_transcript(db, session_id, texts)
        await db.commit()


def exchanges(n: int) -> list[str]:
    """`n` exchanges of small talk after the fact, about 45 tokens each."""
    texts = [FACT, "Noted, I will remember that."]
    for i in range(n):
        texts += [
            f"Question {i}: do you have the trail runner shoes in size {i + 5}?",
            f"Answer {i}: yes, the trail runners come in size {i + 5}, in blue and grey.",
        ]
    return texts


def recalls(method: str) -> float:
    return REGISTRY.get_sample_value("parley_context_recall_total", {"method": method}) or 0.0


async def build_span(sessions: Database, turn_id: str) -> dict[str, Any]:
    """The attributes of the turn's `build_context` span (written a moment after the step)."""
    for _ in range(100):
        async with orm(sessions) as db:
            attrs = await db.scalar(
                select(TraceSpan.attrs).where(
                    TraceSpan.turn_id == turn_id, TraceSpan.name == "build_context"
                )
            )
        if attrs is not None:
            return dict(attrs)
        await asyncio.sleep(0.05)
    raise AssertionError("no build_context span")


# The heading of the prompt's block of recalled lines (parley/prompt.py `recall_block`), and
# the old fact as one of its lines (`seq role: text`).
RECALL_HEADER = "Earlier in this conversation, recalled by search"
FACT_LINE = "1 user: My gym locker code is 4417"


def prompt_text(request: dict[str, Any]) -> str:
    return "\n".join(str(m.get("content")) for m in request["messages"])


async def test_a_conversation_the_window_holds_whole_is_not_searched_nor_embedded(
    settings: Settings,
    temporal_client: Client,
    sessions: Database,
    tokens: dict[str, str],
    counted: tuple[Database, list[str]],
    minilm: MiniLMEmbedder,
) -> None:
    worker_sessions, sent = counted
    history = exchanges(9)
    async with recall_stack(temporal_client, settings, worker_sessions, "fits") as running:
        client = ParleyClient(running.url, tokens["priya"])
        try:
            sid = await client.new_session()
            await seed(sessions, sid, history, summary=4)
            skipped, searched = recalls("skipped"), recalls("fts") + recalls("hybrid")
            sent.clear()
            turn_id, events = await client.turn(sid, QUESTION)
            during_turn = list(sent)
        finally:
            await client.aclose()
    assert events[-1].type == "done"
    # No recall search and no embedding of the question: not in what the worker sent, ...
    assert not [s for s in during_turn if s.startswith(RECALL_SEARCH) or s.startswith(NEAREST)]
    # ... as the counter, the build's span and the stored request say.
    assert recalls("skipped") == skipped + 1
    assert recalls("fts") + recalls("hybrid") == searched
    assert (await build_span(sessions, turn_id))["recall"] == "skipped"
    [call] = await model_calls(sessions, turn_id)
    budget = call.request["budget"]
    assert budget["recall"] == "skipped" and budget["recalled_seqs"] == []
    # The whole conversation fits the conversation budget (600 tokens, the summary's share
    # taken), but not what is left of it once recall's share (200) is held back: where the
    # build used to search anyway (the summary's end kept its first window off seq 1).
    assert 600 - 200 - budget["blocks"]["summary"] < budget["blocks"]["history"] <= 600
    # The model still sees every message, the fact among them, verbatim in the window.
    assert budget["window_from_seq"] == 1
    shown = prompt_text(call.request)
    assert all(text in shown for text in history)


async def test_a_conversation_too_long_for_the_window_still_recalls_the_old_fact(
    settings: Settings,
    temporal_client: Client,
    sessions: Database,
    tokens: dict[str, str],
    counted: tuple[Database, list[str]],
    minilm: MiniLMEmbedder,
) -> None:
    worker_sessions, sent = counted
    history = exchanges(30)  # about 1,300 tokens
    async with recall_stack(temporal_client, settings, worker_sessions, "long") as running:
        client = ParleyClient(running.url, tokens["priya"])
        try:
            sid = await client.new_session()
            await seed(sessions, sid, history, summary=50)
            # The summary run indexes the messages for recall by meaning (off the turn's path).
            memory = MemoryActivities(
                sessions=sessions,
                providers=ProviderPool(settings, primary=DemoModel(token_delay_s=0)),
                settings=settings,
                embedder=minilm,
            )
            assert await memory.embed_messages(sid) == len(history)
            hybrid = recalls("hybrid")
            sent.clear()
            turn_id, events = await client.turn(sid, QUESTION)
            during_turn = list(sent)
        finally:
            await client.aclose()
    assert events[-1].type == "done"
    assert any(s.startswith(RECALL_SEARCH) for s in during_turn)
    assert any(s.startswith(NEAREST) for s in during_turn)  # the question was embedded
    assert recalls("hybrid") == hybrid + 1
    assert (await build_span(sessions, turn_id))["recall"] == "hybrid"
    [call] = await model_calls(sessions, turn_id)
    budget = call.request["budget"]
    assert budget["recall"] == "hybrid"
    assert budget["window_from_seq"] > 2  # the fact left the window long ago ...
    # ... and recall brings it back: the line stands in the prompt's recall block (no other
    # block could carry it), as the search's best match itself, not only as a neighbour of
    # another line.
    [recall_block] = [
        str(m["content"])
        for m in call.request["messages"]
        if str(m.get("content", "")).startswith(RECALL_HEADER)
    ]
    assert FACT_LINE in recall_block
    async with sessions() as db:
        found = await recall_store.recall(
            db, session_id=sid, terms=recall_terms(QUESTION), before_seq=budget["window_from_seq"]
        )
    assert [hit.seq for hit in found.ranked][:1] == [1]
    # Nothing else could have: the summary covers seq 1 without it, and what was folded (the
    # turns between the summary and a window the question's reach back made short) is later.
    folded = budget["folded"]
    assert budget["summary_through_seq"] == 50 and (folded is None or folded["from_seq"] > 1)
    assert FACT_LINE in prompt_text(call.request)


async def test_a_follow_up_about_the_last_turns_is_searched_by_its_words_not_embedded(
    settings: Settings,
    temporal_client: Client,
    sessions: Database,
    tokens: dict[str, str],
    counted: tuple[Database, list[str]],
    minilm: MiniLMEmbedder,
) -> None:
    """A question about what the last turns said (most turns of a chat) reaches back to
    nothing: recall searches it by its words, which those turns share, and its embedding,
    CPU work on the way to the first token, is not computed, though the session's messages
    have vectors and the same stack embeds a question that reaches back (the test above)."""
    worker_sessions, sent = counted
    history = exchanges(30)
    async with recall_stack(temporal_client, settings, worker_sessions, "follow") as running:
        client = ParleyClient(running.url, tokens["priya"])
        try:
            sid = await client.new_session()
            await seed(sessions, sid, history, summary=50)
            memory = MemoryActivities(
                sessions=sessions,
                providers=ProviderPool(settings, primary=DemoModel(token_delay_s=0)),
                settings=settings,
                embedder=minilm,
            )
            assert await memory.embed_messages(sid) == len(history)
            fts, hybrid = recalls("fts"), recalls("hybrid")
            sent.clear()
            # The last answer: "the trail runners come in size 34, in blue and grey".
            turn_id, events = await client.turn(sid, "Do the size 34 trail runners come in grey?")
            during_turn = list(sent)
        finally:
            await client.aclose()
    assert events[-1].type == "done"
    assert any(s.startswith(RECALL_SEARCH) for s in during_turn)
    assert not any(s.startswith(NEAREST) for s in during_turn)
    assert (recalls("fts"), recalls("hybrid")) == (fts + 1, hybrid)
    [call] = await model_calls(sessions, turn_id)
    assert call.request["budget"]["recall"] == "fts"
    # The exchange it asks about is in the prompt, in the recent window.
    assert history[-1] in prompt_text(call.request)


def long_exchanges(n: int) -> list[str]:
    """`n` exchanges of about 150 tokens each after the fact, every one about something else."""
    texts = [FACT, "Noted, I will remember that."]
    for i in range(n):
        texts += [
            f"Entry {i}: on trip {i} I walked the coast path number {i * 7 % 97} with my "
            f"cousin {i % 13}, saw {i % 5 + 2} seals near cove {i * 3 % 41}, ate at cafe "
            f"{i % 17}, and bought postcard set {i * 11 % 89} plus a map of district {i}. "
            f"The weather was {['windy', 'grey', 'bright', 'wet', 'calm'][i % 5]} all day.",
            f"Reply {i}: trip {i} sounds lovely; coast path {i * 7 % 97}, cove {i * 3 % 41}, "
            f"cafe {i % 17} and postcard set {i * 11 % 89} are written down for you.",
        ]
    return texts


async def test_a_three_hundred_turn_conversation_gets_a_larger_budget_within_the_ceiling(
    settings: Settings,
    temporal_client: Client,
    sessions: Database,
    tokens: dict[str, str],
    counted: tuple[Database, list[str]],
) -> None:
    """The conversation budget follows what there is to remember (parley/budget.py): three
    hundred turns of distinct text take the conversation's share past the 600-token floor
    and stop at the ceiling (what recall finds fewer lines for, the recent turns take), and
    the fact from turn 1 is still recalled."""
    worker_sessions, _ = counted
    async with recall_stack(temporal_client, settings, worker_sessions, "ceiling") as running:
        client = ParleyClient(running.url, tokens["priya"])
        try:
            sid = await client.new_session()
            await seed(sessions, sid, long_exchanges(300), summary=50)
            turn_id, events = await client.turn(sid, QUESTION)
        finally:
            await client.aclose()
    assert events[-1].type == "done"
    [call] = await model_calls(sessions, turn_id)
    blocks = call.request["budget"]["blocks"]
    conversation = sum(v for k, v in blocks.items() if k in CONVERSATION_KINDS)
    assert 600 < conversation <= settings.context_conversation_max_tokens, blocks
    assert FACT_LINE in prompt_text(call.request)
