"""(u) Stream scale: how many answers can stream at once before the stream path falls behind.

N turns at once, each answered by a local OpenAI-compatible server that streams like a real
model (`tokens_per_s` tokens a second for `answer_s` seconds: parley.gateway.fake_provider,
scripted), read as SSE by this process. N rises (doubling) until the p95 lag from a delta's
commit (its row's `created_at`, the appending transaction's time) to its frame at the client
crosses `LAG_LIMIT_MS`; the ceiling is the last N under it. Each N prints the lag, PostgreSQL
commits a second, CPU (PostgreSQL's and every process's, per stream), the connections in use,
what PostgreSQL's busy backends waited on (the profile of what binds), and lost or duplicated
events (the client's ids against the log's).

Each stack measured is its own: embedded PostgreSQL, a Temporal dev server, the fake
provider, one worker, one API. The baseline is another commit (`--stream-scale-baseline`,
this issue's starting commit) exported from git and run by this virtualenv through
bench/checkout.py, in the same run, so the ratio is same-machine and same-session. Alone:
`python -m bench.stream_scale [--quick]`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psycopg

from bench.cpu import snapshot, usage
from bench.runner import percentile
from bench.scale_stack import ScaleStack, export_commit, scale_stack
from bench.stack import REPO, log
from parley.store.db import libpq_url

LAG_LIMIT_MS = 250.0
# An answer may take this much longer at the client than the model took to send it.
PACE_LIMIT = 1.25
BASELINE_COMMIT = "6fe9d89"  # issue 45's starting commit
TERMINAL = frozenset({"done", "error", "cancelled"})
# The processes of the stack measured (not the client, the model server or the machine's).
PARLEY_ROLES = ("api", "worker", "temporal", "postgres")


@dataclass
class Received:
    """One turn's stream at the client: each event id with the time its frame arrived."""

    turn_id: str = ""
    frames: list[tuple[int, float]] = field(default_factory=list)
    terminal: str | None = None
    error: str | None = None


async def stream_one(http: httpx.AsyncClient, token: str, session: str, text: str) -> Received:
    got = Received()
    auth = {"Authorization": f"Bearer {token}"}
    try:
        posted = await http.post(
            f"/v1/sessions/{session}/messages",
            json={"client_message_id": uuid.uuid4().hex, "text": text, "expected_last_seq": None},
            headers=auth,
        )
        if posted.status_code != 202:
            raise RuntimeError(f"POST: {posted.status_code} {posted.text[:200]}")
        got.turn_id = posted.json()["turn_id"]
        async with http.stream("GET", posted.json()["events_url"], headers=auth) as response:
            event_id: int | None = None
            event_type = data = ""
            async for line in response.aiter_lines():
                if line.startswith("id:"):
                    event_id = int(line[3:])
                elif line.startswith("event:"):
                    event_type = line[6:].strip()
                elif line.startswith("data:"):
                    data = line[5:]
                elif not line and event_id is not None:
                    got.frames.append((event_id, time.time()))
                    if event_type in TERMINAL:
                        got.terminal = event_type
                        got.error = None if event_type == "done" else data[:200]
                        return got
                    event_id = None
        got.error = "stream closed without a terminal event"
    except Exception as exc:
        got.error = f"{type(exc).__name__}: {exc}"
    return got


class Sampler:
    """PostgreSQL's connections in use and what its busy backends wait on, sampled."""

    def __init__(self, conninfo: str) -> None:
        self._conninfo = conninfo
        self.connections: list[int] = []
        self.busy: list[int] = []
        self.waits: Counter[str] = Counter()
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Sampler:
        self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    async def _run(self) -> None:
        async with await psycopg.AsyncConnection.connect(self._conninfo, autocommit=True) as c:
            while True:
                rows = await (await c.execute(_ACTIVITY)).fetchall()
                self.connections.append(len(rows))
                busy = [r for r in rows if r[0] not in ("idle", None)]
                self.busy.append(len(busy))
                self.waits.update(f"{r[1]}:{r[2]}" if r[1] else "CPU" for r in busy)
                await asyncio.sleep(0.25)


_ACTIVITY = """
    SELECT state, wait_event_type, wait_event FROM pg_stat_activity
    WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()
"""
_COMMITS = "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
_LOGGED = """
    SELECT turn_id, id, type, extract(epoch FROM created_at) FROM turn_events
    WHERE turn_id = ANY(%(turns)s) ORDER BY turn_id, id
"""


async def one_step(
    stack: ScaleStack, http: httpx.AsyncClient, n: int, answer_tokens: int, delay_s: float
) -> dict[str, Any]:
    """N turns at once, each in a session of its own, each answer `answer_tokens` long with
    `delay_s` before each token."""
    conninfo = libpq_url(stack.database_url)
    tokens = stack.tokens[:n]
    sessions = []
    for i in range(0, n, 50):
        made = await asyncio.gather(
            *(
                http.post("/v1/sessions", headers={"Authorization": f"Bearer {token}"})
                for token in tokens[i : i + 50]
            )
        )
        sessions += [r.json()["id"] for r in made]
    async with httpx.AsyncClient(base_url=stack.provider_url) as provider:
        await provider.post("/_fake/reset")
        words = [f"word{i % 97} " for i in range(answer_tokens)]
        # Spares for the calls a retry makes again (a step that timed out under the load).
        reply = {"text": words, "delay_s": delay_s}  # before each token: a model's pace
        await provider.post("/_fake/script", json=[reply] * (3 * n))
    async with await psycopg.AsyncConnection.connect(conninfo, autocommit=True) as conn:
        commits_before = (await (await conn.execute(_COMMITS)).fetchone() or [0])[0]
        cpu_before, started = snapshot(), time.perf_counter()
        async with Sampler(conninfo) as sampler:
            received = await asyncio.gather(
                *(
                    stream_one(http, token, s, f"stream scale turn {i}")
                    for i, (token, s) in enumerate(zip(tokens, sessions, strict=True))
                )
            )
        wall = time.perf_counter() - started
        cpu = usage(cpu_before, snapshot(), stack.roles())
        commits = (await (await conn.execute(_COMMITS)).fetchone() or [0])[0] - commits_before
        turns = [r.turn_id for r in received if r.turn_id]
        logged = await (await conn.execute(_LOGGED, {"turns": turns})).fetchall()
    stack.check()
    return _figures(n, wall, received, logged, cpu, commits, sampler)


def _figures(
    n: int,
    wall: float,
    received: list[Received],
    logged: list[Any],
    cpu: dict[str, Any],
    commits: int,
    sampler: Sampler,
) -> dict[str, Any]:
    committed: dict[str, dict[int, tuple[str, float]]] = {}
    for turn_id, event_id, kind, at in logged:
        committed.setdefault(turn_id, {})[event_id] = (kind, float(at))
    lags: list[float] = []
    lost = duplicated = 0
    for turn in received:
        log_of_turn = committed.get(turn.turn_id, {})
        ids = [i for i, _ in turn.frames]
        duplicated += len(ids) - len(set(ids))
        if turn.terminal:  # every event up to the terminal one, each once
            lost += len({i for i in log_of_turn if i <= ids[-1]} - set(ids))
        for event_id, at in turn.frames:
            kind, committed_at = log_of_turn.get(event_id, ("?", 0.0))
            if kind == "delta":
                lags.append(at - committed_at)
    processes = sum(cpu.get(f"{role}_cpu_s", 0.0) for role in PARLEY_ROLES)
    return {
        "n": n,
        "wall_s": round(wall, 1),
        "deltas": len(lags),
        # How long an answer streamed at the client (the model's pace, if nothing lagged).
        "stream_s_p50": round(
            percentile([r.frames[-1][1] - r.frames[0][1] for r in received if r.frames], 0.5), 1
        ),
        "lag_p50_ms": round(percentile(lags, 0.5) * 1000, 1),
        "lag_p95_ms": round(percentile(lags, 0.95) * 1000, 1),
        "commits_per_s": round(commits / wall, 1),
        "commits_per_s_per_stream": round(commits / wall / n, 2),
        "postgres_cpu_per_stream": round(cpu.get("postgres_cpu_s", 0.0) / wall / n, 4),
        "cpu_per_stream": round(processes / wall / n, 4),
        # Per answer streamed: what one stream costs however fast the stack kept up with it.
        "commits_per_answer": round(commits / n, 1),
        "postgres_cpu_per_answer_s": round(cpu.get("postgres_cpu_s", 0.0) / n, 4),
        "cpu_per_answer_s": round(processes / n, 4),
        "cpu": cpu,
        "connections_max": max(sampler.connections, default=0),
        "connections_busy_max": max(sampler.busy, default=0),
        "waits": dict(sampler.waits.most_common(6)),
        "failed": sum(1 for r in received if r.terminal != "done"),
        "first_errors": [r.error or r.terminal for r in received if r.terminal != "done"][:3],
        "lost": lost,
        "duplicated": duplicated,
    }


async def measure_stack(
    stack: ScaleStack, *, start_n: int, max_n: int, answer_tokens: int, delay_s: float
) -> dict[str, Any]:
    limits = httpx.Limits(max_connections=max_n + 20, max_keepalive_connections=max_n + 20)
    steps: list[dict[str, Any]] = []
    async with httpx.AsyncClient(
        base_url=stack.api_url, limits=limits, timeout=httpx.Timeout(120.0)
    ) as http:
        await one_step(stack, http, 2, 20, delay_s)  # warm-up: imports and caches
        n = start_n
        while n <= max_n:
            log(f"(u) {stack.name}: {n} streams at once")
            step = await one_step(stack, http, n, answer_tokens, delay_s)
            step["pace"] = round(step["stream_s_p50"] / (answer_tokens * delay_s), 2)
            steps.append(step)
            log(f"(u) {stack.name}: N={n} lag p95 {step['lag_p95_ms']} ms, pace {step['pace']}")
            if not _under(step):
                break
            n *= 2
    return {"steps": steps, "ceiling": max((s["n"] for s in steps if _under(s)), default=0)}


def _under(step: dict[str, Any]) -> bool:
    """Below the ceiling: the lag within the limit, the answers at the model's pace (a stack
    that cannot keep up makes the model wait: every token later than the lag says), and no
    turn failed."""
    return step["lag_p95_ms"] <= LAG_LIMIT_MS and step["pace"] <= PACE_LIMIT and not step["failed"]


async def measure_stream_scale(
    *, baseline: str, tokens_per_s: float, answer_s: float, start_n: int, max_n: int
) -> dict[str, Any]:
    """The ceiling of the baseline commit and of this checkout, one stack after the other."""
    delay_ms = 1000.0 / tokens_per_s
    answer_tokens = int(tokens_per_s * answer_s)
    figures: dict[str, Any] = {
        "baseline_commit": baseline,
        "tokens_per_s": tokens_per_s,
        "answer_s": answer_s,
        "load_before": os.getloadavg(),
    }
    with tempfile.TemporaryDirectory(prefix="parley-scale-src-") as src:
        root = export_commit(baseline, Path(src) / "tree")
        for name, checkout in (("baseline", root), ("current", None)):
            async with scale_stack(name, checkout, token_delay_ms=delay_ms, users=max_n) as stack:
                figures[name] = await measure_stack(
                    stack,
                    start_n=start_n,
                    max_n=max_n,
                    answer_tokens=answer_tokens,
                    delay_s=delay_ms / 1000,
                )
    figures["load_after"] = os.getloadavg()
    return figures


def render_stream_scale(figures: dict[str, Any]) -> str:
    lines = [
        f"\n(u) stream scale: {figures['tokens_per_s']:.0f} tokens/s, answers of "
        f"{figures['answer_s']:.0f} s; ceiling = most streams with p95 commit-to-frame lag "
        f"<= {LAG_LIMIT_MS:.0f} ms, answers at <= {PACE_LIMIT}x the model's time, no failure; "
        f"load {figures['load_before']} -> {figures['load_after']}",
        "per answer: commits, PostgreSQL CPU s, all Parley processes' CPU s",
        f"{'stack':9} {'N':>4} {'p50 ms':>7} {'p95 ms':>7} {'pace':>5} {'commit/s':>8} "
        f"{'c/ans':>6} {'pg s/ans':>8} {'cpu s/ans':>9} {'conns':>5} {'busy':>4} {'lost':>4} "
        f"{'dup':>3} {'fail':>4}  PostgreSQL busy backends waited on (samples)",
    ]
    for name in ("baseline", "current"):
        for s in figures[name]["steps"]:
            waits = ", ".join(f"{k} {v}" for k, v in s["waits"].items())
            lines.append(
                f"{name:9} {s['n']:>4} {s['lag_p50_ms']:>7} {s['lag_p95_ms']:>7} "
                f"{s['pace']:>5} {s['commits_per_s']:>8} {s['commits_per_answer']:>6} "
                f"{s['postgres_cpu_per_answer_s']:>8} {s['cpu_per_answer_s']:>9} "
                f"{s['connections_max']:>5} {s['connections_busy_max']:>4} {s['lost']:>4} "
                f"{s['duplicated']:>3} {s['failed']:>4}  {waits}"
            )
    base_steps = {s["n"]: s for s in figures["baseline"]["steps"]}
    for s in figures["current"]["steps"]:
        b = base_steps.get(s["n"])
        if b is None:
            continue
        ratios = [
            f"{label} {s[key] / b[key]:.2f}x" if b[key] else f"{label} n/a"
            for label, key in (
                ("commits", "commits_per_answer"),
                ("PostgreSQL CPU", "postgres_cpu_per_answer_s"),
                ("CPU", "cpu_per_answer_s"),
            )
        ]
        lines.append(f"N={s['n']}: current/baseline per answer: " + ", ".join(ratios))
    base, current = figures["baseline"]["ceiling"], figures["current"]["ceiling"]
    ratio = f"{current / base:.2f}x" if base else "n/a"
    lines.append(
        f"ceiling: baseline ({figures['baseline_commit']}) {base}, current {current} ({ratio})"
    )
    return "\n".join(lines)


def add_scale_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--stream-scale-baseline", default=BASELINE_COMMIT, help="(u) the commit to compare"
    )
    parser.add_argument("--stream-scale-tokens-per-s", type=float, default=40.0)
    parser.add_argument("--stream-scale-answer-s", type=float, default=15.0, help="(u)")
    parser.add_argument("--stream-scale-start-n", type=int, default=10)
    parser.add_argument("--stream-scale-max-n", type=int, default=640)


async def stream_scale(args: argparse.Namespace) -> dict[str, Any]:
    log(f"(u) stream scale against {args.stream_scale_baseline}, stacks of their own")
    return await measure_stream_scale(
        baseline=args.stream_scale_baseline,
        tokens_per_s=args.stream_scale_tokens_per_s,
        answer_s=args.stream_scale_answer_s,
        start_n=args.stream_scale_start_n,
        max_n=args.stream_scale_max_n,
    )


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.stream_scale", description=__doc__)
    add_scale_arguments(parser)
    parser.add_argument("--quick", action="store_true", help="answers of 4 s")
    args = parser.parse_args()
    if args.quick:
        args.stream_scale_answer_s = 4.0
    figures = asyncio.run(stream_scale(args))
    print(render_stream_scale(figures))
    out = REPO / ".data" / "bench" / "stream_scale.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(figures, indent=2, default=str) + "\n")


if __name__ == "__main__":
    main()
