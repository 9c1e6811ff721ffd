"""Hybrid recall: the rank fusion rule, a hit's neighbours found with the search itself, and
(with the optional `embeddings` extra) a question in other words than the message that answers
it, which full-text search cannot find."""

from __future__ import annotations

import json
import math
import uuid

import pytest
from sqlalchemy import text, update

from parley.activities.memory import MemoryActivities
from parley.activities.recall import RecallQuery, recall_hits
from parley.config import Settings
from parley.gateway.demo import DemoModel
from parley.gateway.minilm import MiniLMEmbedder
from parley.gateway.registry import ProviderPool
from parley.memory import recall_terms
from parley.recall import fuse
from parley.store import memory as memory_store
from parley.store.db import Database, connect
from parley.store.models import ChatSession, Message
from tests.support.orm import add_transcript, orm
from tests.support.toolkit import counted_sessions

# --- the fusion rule (pure) -------------------------------------------------------------------


def test_a_message_both_rankings_found_outranks_the_top_of_either_alone() -> None:
    words = ["w1", "both", "w3", "w4"]
    meaning = ["m1", "both", "m3"]
    fused = fuse([words, meaning], k=10)
    assert fused[0] == "both"
    assert set(fused) == set(words) | set(meaning)
    # The rest keep their standing: each ranking's first before its third.
    assert fused.index("w1") < fused.index("w3") and fused.index("m1") < fused.index("m3")


def test_a_small_k_lets_the_top_of_one_ranking_beat_the_middle_of_both() -> None:
    words = [1, 9, 8, 7, 2]
    meaning = [5, 6, 4, 3, 2]
    assert fuse([words, meaning], k=1)[0] == 1  # 1/2 against 2 x 1/6
    assert fuse([words, meaning], k=60)[0] == 2  # 1/61 against 2 x 1/65


def test_one_ranking_alone_keeps_its_order_and_counts_a_repeat_once() -> None:
    assert fuse([[3, 1, 3, 2]]) == [3, 1, 2]
    assert fuse([[3, 1], [1, 3]]) == [3, 1]  # a tie keeps the order first seen
    assert fuse([]) == []
    with pytest.raises(ValueError):
        fuse([[1]], k=0)


# --- recall by meaning, with the real model and PostgreSQL ------------------------------------

EVIDENCE = "I'm a transgender woman, and I came out to my family last spring."
QUESTION = "What did I tell you about my gender identity?"
OTHERS = [
    "Hi! I ordered a rain shell two weeks ago and it still hasn't arrived.",
    "Your order 8472 shipped on Monday and should arrive by Thursday.",
    "Can I return the fleece? It's a size too small.",
    "Yes, returns are free within 30 days of delivery.",
    "I went hiking in the mountains last weekend with my dog.",
    "That sounds lovely. How long was the trail?",
    "About twelve miles, and the view from the ridge was amazing.",
    "I also started a pottery class on Tuesday evenings.",
    "My sister is getting married in June, so I need a dress.",
    "I prefer to be contacted by email rather than phone.",
    "The refund for the camp mug was issued yesterday.",
    "We painted the kitchen a pale green colour.",
    "I'm reading a novel about a detective in Oslo.",
    "My name is Sam and I work as a nurse.",
    "We adopted a cat from the shelter in March.",
]


async def _conversation(sessions: Database, texts: list[str] | None = None) -> tuple[str, int]:
    """A session whose third message is the evidence (or of `texts`); returns its id and the
    next seq."""
    texts = texts or OTHERS[:2] + [EVIDENCE] + OTHERS[2:]
    sid = f"ses_rec{uuid.uuid4().hex[:12]}"
    async with orm(sessions) as db:
        db.add(ChatSession(id=sid, tenant_id="northwind", user_id="cust_2291"))
        await db.flush()
        await add_transcript(db, sid, texts)
        await db.commit()
    return sid, len(texts) + 1


async def test_a_paraphrased_question_recalls_the_turn_full_text_search_misses(
    settings: Settings, sessions: Database, minilm: MiniLMEmbedder
) -> None:
    sid, next_seq = await _conversation(sessions)
    memory = MemoryActivities(
        sessions=sessions,
        providers=ProviderPool(settings, primary=DemoModel(token_delay_s=0)),
        settings=settings,
        embedder=minilm,
    )
    # The summary run indexes the messages (off the turn's path), each once.
    assert await memory.embed_messages(sid) == next_seq - 1
    assert await memory.embed_messages(sid) == 0

    async def recall(embedder: MiniLMEmbedder | None) -> list[int]:
        async with connect(sessions) as conn:  # the build's own connection
            query = RecallQuery(recall_terms(QUESTION), QUESTION, embedder)
            hits = await recall_hits(conn, query, session_id=sid, before_seq=next_seq, limit=2)
        return [h.seq for h in hits]

    assert 3 not in await recall(None)  # no word of the question is in the evidence
    assert 3 in (await recall(minilm))[:2]


def test_the_embedder_multiplies_on_one_thread(minilm: MiniLMEmbedder) -> None:
    """A question's embedding is on the turn's path: with a BLAS thread per core spinning on
    a busy machine it took fourteen times as long (gateway/minilm.py). Once the embedder is
    loaded, NumPy's BLAS runs every product on the calling thread."""
    from threadpoolctl import threadpool_info

    blas = [pool for pool in threadpool_info() if pool["user_api"] == "blas"]
    assert blas  # NumPy's BLAS is loaded
    assert [pool["num_threads"] for pool in blas] == [1] * len(blas)
    assert len(minilm.embed(["one question"])[0]) == minilm.dimensions


def test_a_text_s_vector_is_its_own_whatever_it_is_batched_with(minilm: MiniLMEmbedder) -> None:
    """The embedder batches texts of like length together (less padding: an import's
    indexing takes a third of the CPU) and computes a repeated text once; each text still
    gets its own vector, in the order asked, as when it is embedded alone."""
    texts = [
        "A long message about the trip: we drove to the coast, walked the cliff path for "
        "three hours, ate at the harbour and came back after dark, tired and happy.",
        "ok",
        "I booked two tickets to Lisbon for March.",
        "Thanks!",
        "My sister repaired the garden fence after the storm last week.",
        "Thanks!",
    ]
    together = minilm.embed(texts)
    assert len(together) == len(texts) and together[3] == together[5]
    for said, vector in zip(texts, together, strict=True):
        [alone] = minilm.embed([said])
        assert max(abs(a - b) for a, b in zip(vector, alone, strict=True)) < 1e-5


def test_the_embedder_s_gelu_is_the_exact_one() -> None:
    """The intermediate layers' activation, computed in place for speed, is GELU with the
    exact erf (as the model was trained), on both sides of zero."""
    import math

    import numpy as np

    from parley.gateway.minilm import _gelu

    xs = np.linspace(-8.0, 8.0, 2001, dtype=np.float32).reshape(1, -1)
    exact = [0.5 * float(x) * (1.0 + math.erf(float(x) / math.sqrt(2.0))) for x in xs[0]]
    assert max(abs(float(g) - e) for g, e in zip(_gelu(xs)[0], exact, strict=True)) < 1e-5


async def test_a_hit_comes_with_its_neighbours_in_the_search_s_one_statement(
    database_url: str, sessions: Database
) -> None:
    """Full-text recall shows the messages around its best hits (the question a matching
    answer replied to, the reply a matching question got) though they share no word with the
    question; the search's own statement brings them, with no read of their own; a retracted
    neighbour is not shown."""
    sid, next_seq = await _conversation(sessions)
    hiking, reply, miles = 6, 7, 8  # "I went hiking ...", "That sounds lovely ...", "About ..."
    async with orm(sessions) as db:
        await db.execute(
            update(Message)
            .where(Message.session_id == sid, Message.seq == miles)
            .values(status="retracted")
        )
        await db.commit()
    async with counted_sessions(database_url) as (counted, sent), connect(counted) as conn:
        question = "Where did I go hiking?"
        query = RecallQuery(recall_terms(question), question)
        hits = await recall_hits(conn, query, session_id=sid, before_seq=next_seq, limit=4)
    by_seq = {h.seq: h for h in hits}
    assert by_seq[hiking].text == OTHERS[4]  # the one message with the question's word
    assert by_seq[reply].text == OTHERS[5]  # the message after it, ...
    assert by_seq[hiking - 1].text == OTHERS[3]  # ... and the one before it
    assert miles not in by_seq  # retracted: never recalled
    assert all(h.seq < next_seq for h in hits)
    assert len(sent) == 1, sent


async def test_vectors_are_removed_with_their_messages(
    settings: Settings, sessions: Database, minilm: MiniLMEmbedder
) -> None:
    sid, _ = await _conversation(sessions)
    memory = MemoryActivities(
        sessions=sessions,
        providers=ProviderPool(settings, primary=DemoModel(token_delay_s=0)),
        settings=settings,
        embedder=minilm,
    )
    await memory.embed_messages(sid)
    count = text("SELECT count(*) FROM message_embeddings WHERE session_id = :sid")
    async with orm(sessions) as db:
        assert await db.scalar(count, {"sid": sid}) == len(OTHERS) + 1
        await db.execute(text("DELETE FROM messages WHERE session_id = :sid"), {"sid": sid})
        await db.commit()
        assert await db.scalar(count, {"sid": sid}) == 0


async def test_a_transcript_s_speakers_are_read_and_its_lines_embedded_for_what_they_say(
    settings: Settings, sessions: Database, minilm: MiniLMEmbedder
) -> None:
    """A conversation brought in as a transcript names its speaker in every line. The
    session's speakers are read (a label that starts a line or two is not one), and each line
    is embedded without its label and greetings, so that a question, without those names, is
    compared with what was said rather than with who said it."""
    transcript = [
        f"{'Mira' if n % 2 else 'Tomas'}: {body}" for n, body in enumerate(OTHERS, start=1)
    ]
    transcript[6] = "Mira: Hey Tomas! How are you? I took my sister fishing on Sunday."
    transcript.append("Note: the vet moved to Friday.")
    sid, next_seq = await _conversation(sessions, transcript)
    async with sessions() as db:
        assert await memory_store.speakers(db, session_id=sid, before_seq=next_seq) == [
            "Mira",
            "Tomas",
        ]
        assert await memory_store.speakers(db, session_id=sid, before_seq=3) == []
    memory = MemoryActivities(
        sessions=sessions,
        providers=ProviderPool(settings, primary=DemoModel(token_delay_s=0)),
        settings=settings,
        embedder=minilm,
    )
    await memory.embed_messages(sid)
    stored = text(
        "SELECT CAST(embedding AS text) FROM message_embeddings WHERE session_id = :sid AND seq = 7"
    )
    async with orm(sessions) as db:
        vector = json.loads(await db.scalar(stored, {"sid": sid}))
    (meant,) = minilm.embed(["I took my sister fishing on Sunday."])
    (whole,) = minilm.embed([transcript[6]])
    assert _cosine(vector, meant) > 0.999
    assert _cosine(vector, whole) < 0.95


def _cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    return dot / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))
