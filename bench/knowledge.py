"""(f) Knowledge retrieval quality: top-3 hit rate on labelled questions (bench/data/
knowledge_questions.json, about five per Northwind document), full-text search alone and
hybrid (full-text fused with vector search by reciprocal rank).

The vectors are the fake provider's (gateway/fake_provider/embeddings.py): a hashed
bag-of-words, NOT a semantic model; they match shared words only, so the hybrid figure shows
the fusion machinery working, not what a real embedding model would add. A hit is the
labelled document among the top 3 passages; a section hit is the labelled section.
`python -m bench.knowledge` runs this alone on its own embedded PostgreSQL.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from parley.gateway.fake_provider.embeddings import MODEL, hashed_embedding
from parley.knowledge import Passage, fuse, query_terms, standalone_query
from parley.launch.knowledge import embed_chunks, load_library, read_library
from parley.store import knowledge as knowledge_store
from parley.store.db import Database, Db

QUESTIONS = Path(__file__).resolve().parent / "data" / "knowledge_questions.json"
TOP = 3
TENANT = "northwind"


class FakeEmbedder:
    """The fake provider's vectors, computed in process (the same function it serves)."""

    model = MODEL

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        return [hashed_embedding(t) for t in texts]


async def _rank(db: Db, question: str, *, hybrid: bool) -> list[Passage]:
    query = standalone_query(question)
    text_hits = await knowledge_store.search_text(
        db, tenant_id=TENANT, terms=query_terms(query), limit=TOP * 2
    )
    if not hybrid:
        return text_hits[:TOP]
    [vector] = await FakeEmbedder().embed([query])
    vector_hits = await knowledge_store.search_vector(
        db, tenant_id=TENANT, model=MODEL, vector=vector, limit=TOP * 2
    )
    by_key = {p.key: p for p in [*text_hits, *vector_hits]}
    fused = fuse([[p.key for p in text_hits], [p.key for p in vector_hits]])
    return [by_key[k] for k in fused[:TOP]]


async def measure_knowledge(sessions: Database) -> dict[str, Any]:
    questions = json.loads(QUESTIONS.read_text())
    async with sessions() as db:
        await load_library(db, read_library())
        vectors = await knowledge_store.has_vectors(db)
        if vectors:
            await embed_chunks(db, TENANT, FakeEmbedder())
        await db.commit()
        results: dict[str, Any] = {"questions": len(questions), "top": TOP}
        for method in ("fts", "hybrid") if vectors else ("fts",):
            doc_hits = section_hits = 0
            misses = []
            for item in questions:
                top = await _rank(db, item["q"], hybrid=method == "hybrid")
                doc_hit = any(p.doc == item["doc"] for p in top)
                doc_hits += doc_hit
                section_hits += any(
                    p.doc == item["doc"] and p.section == item["section"] for p in top
                )
                if not doc_hit:
                    misses.append(item["q"])
            results[method] = {
                "doc_hit_rate": doc_hits / len(questions),
                "section_hit_rate": section_hits / len(questions),
                "misses": misses,
            }
    return results


def render_knowledge(results: dict[str, Any]) -> str:
    lines = [
        f"(f) Knowledge retrieval: top-{results['top']} hit rate on {results['questions']} "
        "labelled Northwind questions",
        f"{'':<34}{'document hit':>14}{'section hit':>13}",
    ]
    labels = {
        "fts": "full-text (ts_rank_cd, OR)",
        "hybrid": "hybrid (RRF, fake hashed-BoW vec)",
    }
    for method, label in labels.items():
        if method in results:
            r = results[method]
            lines.append(
                f"{label:<34}{r['doc_hit_rate'] * 100:>13.0f}%{r['section_hit_rate'] * 100:>12.0f}%"
            )
    for method in labels:
        for miss in results.get(method, {}).get("misses", []):
            lines.append(f"  {method} miss: {miss}")
    if "hybrid" not in results:
        lines.append("hybrid: not measured (this PostgreSQL has no pgvector)")
    lines.append(
        "note: the vectors are the fake provider's hashed bag-of-words, not a semantic model"
    )
    return "\n".join(lines)


async def _standalone() -> None:
    from parley.store.db import create_engine
    from parley.store.embedded import EmbeddedPostgres
    from parley.store.identity import seed_demo
    from parley.store.migrate import upgrade

    with tempfile.TemporaryDirectory() as scratch:
        pg = EmbeddedPostgres(Path(scratch) / "pg")
        url = pg.start()
        try:
            upgrade(url)
            engine = create_engine(url, pool_size=2)
            sessions = Database(engine)
            async with sessions() as db:
                await seed_demo(db)
                await db.commit()
            print(render_knowledge(await measure_knowledge(sessions)))
            await engine.dispose()
        finally:
            pg.stop()


if __name__ == "__main__":
    asyncio.run(_standalone())
