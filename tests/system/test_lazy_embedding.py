"""Messages are embedded for recall by meaning only once recall may search them: a short chat's
turns ask for no summary pass and store no vectors; a conversation that outgrows the window has
every message embedded a turn before the first search that could read it, so a question in
other words still finds, by meaning, the message that has just left the window. The worker
embeds them after the turn's tail step asks (activities/indexing.py): no summary run starts
only to embed them.

Through the whole stack (API, Temporal, a worker with the local MiniLM embedder, PostgreSQL):
the summary workflow as the server has it, the vectors as stored, the request the model got."""

from __future__ import annotations

from typing import Any

from sqlalchemy import text
from temporalio.client import Client

from parley.activities import indexing
from parley.activities.recall import RecallQuery, recall_hits
from parley.config import Settings
from parley.gateway.demo import DemoModel
from parley.gateway.minilm import MiniLMEmbedder
from parley.memory import recall_terms
from parley.store import embeddings as embedding_store
from parley.store.db import Database, connect
from tests.support.client import ParleyClient
from tests.support.orm import add_transcript, orm
from tests.support.summary_runs import run_settled, turn_closed
from tests.support.toolkit import model_calls, own_stack

# A statement and a question about it that share no word (tests/api/test_recall.py): only
# recall by meaning can bring the one back for the other.
EVIDENCE = "I'm a transgender woman, and I came out to my family last spring."
QUESTION = "What did I tell you about my gender identity?"
# Small talk the demo model answers with its standing offer (no tool, no order).
CHAT = [
    "I went hiking in the mountains last weekend with my dog.",
    "About twelve miles, and the view from the ridge was amazing.",
    "I also started a pottery class on Tuesday evenings.",
    "We painted the kitchen a pale green colour.",
    "I'm reading a novel about a detective in Oslo.",
    "We adopted a cat from the shelter in March.",
    "My neighbour grows tomatoes on his balcony.",
    "The bakery on our street sells rye bread on Fridays.",
    "I am learning to play the cello, slowly.",
    "Our team won the quiz night at the pub.",
]
# A small conversation budget (the window holds about six exchanges of small talk), no recall
# share beyond the reach-back one, and no folding (a summary run would only embed).
SMALL = {
    "embeddings": "local-minilm",
    "summary_start_delay_ms": 0,
    "summary_min_new_tokens": 100_000,
    "context_conversation_tokens": 300,
    "context_recall_tokens": 100,
}
# The default conversation budget: half its smallest window holds two exchanges.
SHORT = SMALL | {"context_conversation_tokens": 600}
COUNT = text("SELECT count(*) FROM message_embeddings WHERE session_id = :sid")


async def vectors(sessions: Database, session_id: str) -> int:
    async with orm(sessions) as db:
        count = await db.scalar(COUNT, {"sid": session_id})
    return int(count or 0)


async def test_a_short_chat_starts_no_summary_run_and_stores_no_vectors(
    settings: Settings, temporal_client: Client, sessions: Database, tokens: dict[str, str]
) -> None:
    async with own_stack(
        temporal_client, settings, sessions, DemoModel(token_delay_s=0), prefix="short", **SHORT
    ) as stack:
        client = ParleyClient(stack.url, tokens["priya"])
        try:
            sid = await client.new_session()
            for text in [EVIDENCE, *CHAT[:1]]:
                turn_id, events = await client.turn(sid, text)
                assert events[-1].type == "done", events[-1]
                await turn_closed(temporal_client, turn_id)
                await indexing.idle()  # whatever the turn asked to embed is stored
                [call] = await model_calls(sessions, turn_id)
                assert call.request["budget"]["recall"] == "skipped"
        finally:
            await client.aclose()
    # The turns' tail steps found nothing for a pass to do: the server never saw a run ...
    assert await run_settled(temporal_client, sid) == "none"
    # ... and no message was embedded: recall never searched this conversation.
    assert await vectors(sessions, sid) == 0


async def test_a_long_chat_s_vectors_are_there_a_turn_before_recall_reads_them(
    settings: Settings,
    temporal_client: Client,
    sessions: Database,
    tokens: dict[str, str],
    minilm: MiniLMEmbedder,
) -> None:
    stored_after: list[int] = []  # the session's vectors after each turn
    recall: list[str] = []  # what recall did in each turn's build
    async with own_stack(
        temporal_client, settings, sessions, DemoModel(token_delay_s=0), prefix="long", **SMALL
    ) as stack:
        client = ParleyClient(stack.url, tokens["priya"])
        try:
            sid = await client.new_session()

            async def turn(text: str) -> tuple[str, dict[str, Any]]:
                turn_id, events = await client.turn(sid, text)
                assert events[-1].type == "done", events[-1]
                await turn_closed(temporal_client, turn_id)
                await indexing.idle()  # whatever the turn asked to embed is stored
                [call] = await model_calls(sessions, turn_id)
                budget: dict[str, Any] = call.request["budget"]
                recall.append(budget["recall"])
                stored_after.append(await vectors(sessions, sid))
                return turn_id, budget

            for text in CHAT:
                await turn(text)
            await turn(EVIDENCE)
            await turn(CHAT[0].replace("dog", "sister"))  # the turn between it and the question
            _, asked = await turn(QUESTION)
        finally:
            await client.aclose()

    # Lazily: the first turns stored no vectors, ...
    assert stored_after[0] == 0
    first_embedded = next(i for i, n in enumerate(stored_after) if n)
    # ... and the turn that embedded the conversation came at least a whole turn before the
    # first turn whose recall searched it (the margin).
    first_search = next(i for i, method in enumerate(recall) if method != "skipped")
    assert first_embedded < first_search - 1, (stored_after, recall)
    # Once embedding, every turn left every message stored so far with its vector (each turn
    # a question and its answer): the question's turn found the evidence's there. No summary
    # run embedded them: none was started (nothing was due to fold).
    assert await run_settled(temporal_client, sid) == "none"
    assert stored_after[first_embedded:] == [
        2 * (i + 1) for i in range(first_embedded, len(stored_after))
    ]
    # The question reaches back: recall (hybrid) searches all but the last turn, and the
    # evidence, two turns back, has just left the window; recall shows it.
    assert asked["recall"] == "hybrid"
    evidence_seq = 2 * len(CHAT) + 1
    assert asked["window_from_seq"] == evidence_seq + 2
    assert evidence_seq in asked["recalled_seqs"]
    # By meaning: its vector is the question's nearest, and full-text search alone does not
    # bring it.
    (question,) = minilm.embed([QUESTION])
    async with connect(sessions) as conn:
        nearest = await embedding_store.nearest(
            conn,
            session_id=sid,
            model=minilm.name,
            query=question,
            before_seq=evidence_seq + 2,
            limit=1,
        )
        words = RecallQuery(recall_terms(QUESTION), QUESTION)
        hits = await recall_hits(conn, words, session_id=sid, before_seq=evidence_seq + 2, limit=8)
    assert nearest == [evidence_seq]
    assert evidence_seq not in [h.seq for h in hits]


async def test_a_backlog_stored_without_vectors_is_embedded_after_the_next_turn(
    settings: Settings, temporal_client: Client, sessions: Database, tokens: dict[str, str]
) -> None:
    """A session whose messages were stored without vectors (or their token counts: from
    before either was recorded) is embedded whole after its next turn, still with no summary
    run."""
    async with own_stack(
        temporal_client, settings, sessions, DemoModel(token_delay_s=0), prefix="backlog", **SMALL
    ) as stack:
        client = ParleyClient(stack.url, tokens["priya"])
        try:
            sid = await client.new_session()
            texts = [text for line in CHAT for text in (line, "Noted.")] * 2  # 40 messages
            await seed(sessions, sid, texts)
            turn_id, events = await client.turn(sid, QUESTION)
            assert events[-1].type == "done", events[-1]
            await turn_closed(temporal_client, turn_id)
            await indexing.idle()
        finally:
            await client.aclose()
    assert await vectors(sessions, sid) == len(texts) + 2  # the question and its answer too
    assert await run_settled(temporal_client, sid) == "none"


async def seed(sessions: Database, session_id: str, texts: list[str]) -> None:
    """A transcript as earlier turns would have stored it (seq 1..n, user then assistant),
    with no vectors."""
    async with orm(sessions) as db:
        await add_transcript(db, session_id, texts)
        await db.commit()
