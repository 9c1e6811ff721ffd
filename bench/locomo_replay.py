"""A fast loop for (o): the ten LoCoMo conversations stored once, then every question's recall
replayed through production's own code in about a minute.

    python -m bench.locomo_replay prepare DIR [--convs 26,44]   # minutes, once
    python -m bench.locomo_replay eval DIR [--convs 26,44]      # about a minute

`prepare` stores each conversation (bench/memory.py `ingest`: speaker A as the user, each
line `Speaker: text` with its photo's caption, at its session's date) in a PostgreSQL kept
under DIR, embeds every message as the import workflow would, and writes DIR/sessions.json.
`eval` restarts that PostgreSQL and, for every category 1-4 question, runs what a turn that
reaches back runs: the budget rule on the session's distinct text (parley/budget.py), the
recall search (activities/recall.py `recall_hits`: its SQL, recall by meaning, fusion and
neighbours) and the recall block (parley/prompt.py `recall_block`), and counts a question
found when the block shows every evidence line. Code changes to any of those are measured
as they stand; nothing is reimplemented here.

It differs from (o) in what (o) adds to the session as it asks: the questions asked before
and the model's answers (the window holds them, and recall can find them), and the budget
they add to the distinct text. The footprint printed is the recall block's tokens over the
conversation's; (o)'s adds the recent window, about a quarter of the conversation budget.
Nothing here reads the evidence to rank.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections import Counter
from dataclasses import replace
from datetime import date
from pathlib import Path
from typing import Any

from bench.locomo_import import DEFAULT_DIR
from bench.memory import ingest, load_locomo
from parley.activities.recall import (
    RecallQuery,
    budget_rule,
    candidate_limit,
    embed_pending,
    recall_hits,
)
from parley.config import Settings
from parley.gateway.minilm import Embedder, build_embedder
from parley.memory import recall_terms
from parley.periods import named_period
from parley.prompt import RECALLED_SEQ, Budgets, recall_block
from parley.recall import without_speakers
from parley.store import memory as memory_store
from parley.store.db import Database, create_engine
from parley.store.embedded import EmbeddedPostgres
from parley.tenancy import TenantConfig
from parley.tokens import counter_for

CATEGORIES = (1, 2, 3, 4)
# Overrides of the configured budget rule, for trying a share (parley/budget.py BudgetRule).
RULE: dict[str, Any] = {}


class _Memo:
    """The embedder, remembering each question's vector: every replay asks the same ones."""

    def __init__(self, embedder: Embedder, path: Path) -> None:
        self._embedder, self._path = embedder, path
        self.name, self.dimensions = embedder.name, embedder.dimensions
        self._known: dict[str, list[float]] = json.loads(path.read_text()) if path.exists() else {}

    def embed(self, texts: list[str]) -> list[list[float]]:
        todo = [t for t in texts if t not in self._known]
        if todo:
            self._known.update(zip(todo, self._embedder.embed(todo), strict=True))
        return [self._known[t] for t in texts]

    def save(self) -> None:
        self._path.write_text(json.dumps(self._known))


def _conversations(names: list[str] | None) -> dict[str, dict[str, Any]]:
    paths = sorted(DEFAULT_DIR.glob("[0-9]*.json"))
    if names:
        paths = [DEFAULT_DIR / f"{n}.json" for n in names]
    return {k.removeprefix("conv-"): v for k, v in load_locomo(paths).items()}


async def prepare(folder: Path, names: list[str] | None) -> None:
    from parley.store.identity import seed_demo
    from parley.store.migrate import upgrade

    pg = EmbeddedPostgres(folder / "pg" / "data")
    url = await asyncio.to_thread(pg.start)
    manifest_path = folder / "sessions.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    try:
        await asyncio.to_thread(upgrade, url)
        engine = create_engine(url)
        sessions = Database(engine)
        if not manifest:
            async with sessions() as db:
                await seed_demo(db)
                await db.commit()
        embedder = _embedder(url)
        for name, conv in _conversations(names).items():
            if name in manifest:
                continue
            started = time.perf_counter()
            sid, seqs, total = await ingest(sessions, conv)
            while await embed_pending(sessions, embedder, session_id=sid):
                pass
            manifest[name] = {"sid": sid, "seqs": seqs, "total": total}
            manifest_path.write_text(json.dumps(manifest))
            print(f"{name}: {len(seqs)} messages in {time.perf_counter() - started:.0f} s")
        await engine.dispose()
    finally:
        pg.stop()


def _embedder(url: str) -> Embedder:
    embedder = build_embedder(Settings(database_url=url, embeddings="local-minilm"))
    if embedder is None:
        raise SystemExit("the embeddings extra is needed (make embeddings)")
    return embedder


async def evaluate(folder: Path, names: list[str] | None, *, show: bool = False) -> None:
    manifest = json.loads((folder / "sessions.json").read_text())
    pg = EmbeddedPostgres(folder / "pg" / "data")
    url = await asyncio.to_thread(pg.start)
    counter = counter_for(None)
    settings = Settings(database_url="postgresql://unused")
    floor = Budgets(
        window=10**6,
        reserve=0,
        conversation=settings.context_conversation_tokens,
        recall=settings.context_recall_tokens,
    )
    rule = replace(budget_rule(floor, settings, TenantConfig()), **RULE)
    today = date.today()
    rows = []
    why: dict[int, Counter[str]] = {c: Counter() for c in CATEGORIES}
    try:
        engine = create_engine(url)
        sessions = Database(engine)
        embedder = _Memo(_embedder(url), folder / "questions.json")
        for name, conv in _conversations(names).items():
            kept = manifest[name]
            sid, seqs, total = kept["sid"], kept["seqs"], kept["total"]
            before = max(seqs.values()) + 1
            found: Counter[int] = Counter()
            asked: Counter[int] = Counter()
            tokens = cpu = 0.0
            async with sessions() as db:
                remembered = await memory_store.remembered_tokens(
                    db, session_id=sid, before_seq=before
                )
                budget = rule.recall(rule.conversation(remembered), reaches_back=True)
                named = await memory_store.speakers(db, session_id=sid, before_seq=before)
                for qa in conv["qa"]:
                    if qa["category"] not in CATEGORIES or not qa["evidence"]:
                        continue
                    wanted = {seqs.get(e) for e in qa["evidence"]}
                    if None in wanted:
                        continue
                    query = RecallQuery(
                        terms=recall_terms(qa["question"]),
                        question=without_speakers(qa["question"], named),
                        embedder=embedder,
                        period=named_period(qa["question"], today),
                    )
                    started = time.process_time()
                    hits = await recall_hits(
                        db,
                        query,
                        session_id=sid,
                        before_seq=before,
                        limit=candidate_limit(budget),
                        budget=budget,
                    )
                    blocks = recall_block(
                        counter, hits, Budgets(window=10**6, reserve=0, recall=budget)
                    )
                    cpu += time.process_time() - started
                    content = str(blocks[0].messages[0]["content"]) if blocks else ""
                    shown = {int(s) for s in RECALLED_SEQ.findall(content)}
                    tokens += blocks[0].tokens if blocks else 0
                    asked[qa["category"]] += 1
                    if wanted <= shown:
                        found[qa["category"]] += 1
                    else:
                        order = [h.seq for h in hits]
                        missing = wanted - shown
                        for seq in wanted - shown:
                            why[qa["category"]]["cut" if seq in order else "unranked"] += 1
                        if show:
                            print(
                                f"  missed {name} c{qa['category']} {qa['question']!r} "
                                f"{sorted(wanted - shown)} at "
                                f"{[order.index(s) if s in order else None for s in missing]}"
                                f" of {len(order)}, shown {len(shown)}"
                            )
            n = sum(asked.values())
            rows.append((name, found, asked, tokens / n / total, cpu * 1000 / n, budget))
        embedder.save()
        await engine.dispose()
    finally:
        pg.stop()
    print(render(rows))
    print(
        "missing evidence lines, ranked but cut by the budget / not among the candidates:",
        {c: dict(w) for c, w in why.items()},
    )


def render(rows: list[tuple[str, Counter[int], Counter[int], float, float, int]]) -> str:
    def pct(f: int, a: int) -> str:
        return f"{f / a * 100:6.1f}%" if a else "      -"

    lines = [
        f"{'conv':<6}{'qs':>5}{'recall':>8}"
        + "".join(f"{'cat ' + str(c):>8}" for c in CATEGORIES)
        + f"{'block':>8}{'budget':>8}{'ms/q':>7}"
    ]
    every: Counter[str] = Counter()
    recalls = []
    for name, found, asked, footprint, ms, budget in rows:
        n = sum(asked.values())
        recalls.append(sum(found.values()) / n)
        for c in CATEGORIES:
            every[f"f{c}"] += found[c]
            every[f"a{c}"] += asked[c]
        lines.append(
            f"{name:<6}{n:>5}{pct(sum(found.values()), n):>8}"
            + "".join(f"{pct(found[c], asked[c]):>8}" for c in CATEGORIES)
            + f"{footprint * 100:>7.1f}%{budget:>8}{ms:>7.0f}"
        )
    lines.append(
        f"{'all':<6}{'':>5}{sum(recalls) / len(recalls) * 100:>7.1f}%"
        + "".join(f"{pct(every[f'f{c}'], every[f'a{c}']):>8}" for c in CATEGORIES)
        + f"   lowest {min(recalls) * 100:.1f}%"
    )
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.locomo_replay")
    parser.add_argument("mode", choices=("prepare", "eval"))
    parser.add_argument("folder", type=Path)
    parser.add_argument("--convs", type=lambda v: [n for n in v.split(",") if n], default=None)
    parser.add_argument("--show", action="store_true", help="print each missed question")
    args = parser.parse_args(argv)
    if args.mode == "prepare":
        asyncio.run(prepare(args.folder, args.convs))
    else:
        asyncio.run(evaluate(args.folder, args.convs, show=args.show))


if __name__ == "__main__":
    main(sys.argv[1:])
