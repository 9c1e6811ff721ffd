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
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psycopg
from temporalio.client import Client

from bench.cpu import Roles, snapshot, usage
from bench.runner import percentile
from bench.stack import (
    REPO,
    Child,
    _postmaster_pid,
    _seed_and_token,
    _stop,
    _wait_ready,
    free_port,
    log,
    spawn,
    start_postgres,
    start_temporal,
)
from parley.config import Settings
from parley.dispatch.deployment import wait_promoted
from parley.store.db import Database, create_engine, libpq_url
from parley.store.identity import create_token
from parley.store.migrate import upgrade

LAG_LIMIT_MS = 250.0
BASELINE_COMMIT = "6fe9d89"  # issue 45's starting commit
TERMINAL = frozenset({"done", "error", "cancelled"})
LAUNCHER = REPO / "bench" / "checkout.py"


@dataclass
class ScaleStack:
    name: str
    api_url: str
    provider_url: str
    database_url: str
    tokens: list[str]  # a user each: one user's turns and streams share its locks and limits
    children: list[Child]
    postmaster: int | None

    def roles(self) -> Roles:
        by_pid = {os.getpid(): "bench_client"}
        by_pid |= {c.process.pid: c.name.split("-")[0] for c in self.children}
        by_parent = {os.getpid(): "temporal"}
        if self.postmaster is not None:
            by_pid[self.postmaster] = "postgres"
            by_parent[self.postmaster] = "postgres"
        return Roles(by_pid, by_parent)

    def check(self) -> None:
        for child in self.children:
            child.check()


def export_commit(commit: str, into: Path) -> Path:
    """The tree of `commit` (git archive: no worktree to clean up), with the link the
    editable install writes into the `parley` package (setup.py)."""
    into.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", "--format=tar", commit],
        check=True,
        capture_output=True,
    )
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    (into / "parley" / "worker.py").symlink_to("../worker.py")
    return into


def _module(root: Path | None, module: str, *args: str) -> list[str]:
    """`-m module args` for this checkout, or through the launcher for another's."""
    if root is None:
        return ["-m", module, *args]
    return [str(LAUNCHER), str(root), "-m", module, *args]


@contextlib.asynccontextmanager
async def scale_stack(
    name: str, root: Path | None, *, token_delay_ms: float, users: int
) -> AsyncIterator[ScaleStack]:
    """One stack of the checkout at `root` (None: this one), stopped and deleted on exit."""
    tmp = Path(tempfile.mkdtemp(prefix=f"parley-scale-{name}-"))
    pg = env = None
    children: list[Child] = []
    try:
        pg, database_url = await start_postgres(tmp)
        migrate_env = {**os.environ, "DATABASE_URL": database_url}
        if root is None:
            await asyncio.to_thread(upgrade, database_url)
        else:
            args = [sys.executable, *_module(root, "parley.launch.cli", "migrate")]
            await asyncio.to_thread(subprocess.run, args, env=migrate_env, check=True, cwd=root)
        await _seed_and_token(database_url)
        tokens = await _users(database_url, users)
        env = await start_temporal(eager=True, log_name=f"temporal-{name}")
        address = str(env.client.service_client.config.target_host)
        provider_port, api_port = free_port(), free_port()
        provider_url = f"http://127.0.0.1:{provider_port}"
        settings = Settings(
            database_url=database_url,
            temporal_address=address,
            task_queue=f"scale-{name}-{uuid.uuid4().hex[:6]}",
            worker_build_id=f"scale-{name}",
        )
        service_env = {
            **os.environ,
            "DATABASE_URL": database_url,
            "TEMPORAL_ADDRESS": address,
            "PARLEY_TASK_QUEUE": settings.task_queue,
            "PARLEY_WORKER_BUILD_ID": settings.worker_build_id,
            "PARLEY_MODEL_PROVIDER": "openai",
            "PARLEY_MODEL": "gpt-stream",
            "OPENAI_BASE_URL": provider_url + "/v1",
            "OPENAI_API_KEY": "bench-local-server",
            "PARLEY_MAX_STREAMS_PER_USER": "100000",
            "PARLEY_MAX_ACTIVE_TURNS_PER_USER": "100000",
            "PARLEY_USER_REQUESTS_PER_MINUTE": "1000000",
            "PARLEY_TENANT_REQUESTS_PER_MINUTE": "1000000",
            "PARLEY_MAX_SESSIONS_PER_USER_PER_DAY": "1000000",
            "PARLEY_USER_DAILY_MESSAGES": "0",
            "PARLEY_WORKER_METRICS_PORT": "0",
            "PYTHONUNBUFFERED": "1",
        }
        provider = spawn(
            f"provider-{name}",
            ["-m", "parley.gateway.fake_provider", "--port", str(provider_port)]
            + ["--token-delay-ms", str(token_delay_ms)],
            service_env,
        )
        children.append(provider)
        await _wait_ready(provider_url + "/_fake/requests", provider)
        worker = spawn(f"worker-{name}", _module(root, "parley.launch.cli", "worker"), service_env)
        children.append(worker)
        api_args = ["api", "--host", "127.0.0.1", "--port", str(api_port)]
        api = spawn(f"api-{name}", _module(root, "parley.launch.cli", *api_args), service_env)
        children.append(api)
        api_url = f"http://127.0.0.1:{api_port}"
        await _wait_ready(api_url + "/readyz", api)
        await wait_promoted(await Client.connect(address), settings, 60)
        yield ScaleStack(
            name,
            api_url,
            provider_url,
            database_url,
            tokens,
            children,
            _postmaster_pid(pg.pgdata),
        )
    finally:
        for child in reversed(children):
            with contextlib.suppress(Exception):
                _stop(child)
        if env is not None:
            with contextlib.suppress(Exception):
                await env.shutdown()
        if pg is not None:
            with contextlib.suppress(Exception):
                await asyncio.to_thread(pg.stop)
        shutil.rmtree(tmp, ignore_errors=True)


async def _users(database_url: str, count: int) -> list[str]:
    """A token for each of `count` customers of the demo tenant, made for the run."""
    engine = create_engine(database_url, pool_size=1)
    try:
        async with Database(engine)() as db:
            await db.run(_USERS, {"count": count})
            tokens = [
                await create_token(db, tenant_id="northwind", user_id=f"scale_{i}")
                for i in range(count)
            ]
            await db.commit()
            return tokens
    finally:
        await engine.dispose()


_USERS = """
    INSERT INTO users (tenant_id, id, display_name)
    SELECT 'northwind', 'scale_' || i, 'Scale ' || i FROM generate_series(0, %(count)s - 1) AS i
"""


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
    processes = sum(v for k, v in cpu.items() if k.endswith("_cpu_s") and k != "other_cpu_s")
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
            steps.append(step)
            log(f"(u) {stack.name}: N={n} lag p95 {step['lag_p95_ms']} ms")
            if step["lag_p95_ms"] > LAG_LIMIT_MS or step["failed"] > n // 10:
                break
            n *= 2
    under = [s for s in steps if s["lag_p95_ms"] <= LAG_LIMIT_MS and not s["failed"]]
    return {"steps": steps, "ceiling": max((s["n"] for s in under), default=0)}


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
        f"<= {LAG_LIMIT_MS:.0f} ms; load {figures['load_before']} -> {figures['load_after']}",
        f"{'stack':9} {'N':>5} {'p50 ms':>8} {'p95 ms':>8} {'commit/s':>9} {'c/s/str':>8} "
        f"{'pgCPU/str':>9} {'CPU/str':>8} {'conns':>6} {'busy':>5} {'lost':>5} {'dup':>4} "
        f"{'fail':>5}  waits",
    ]
    for name in ("baseline", "current"):
        for s in figures[name]["steps"]:
            waits = ", ".join(f"{k} {v}" for k, v in s["waits"].items())
            lines.append(
                f"{name:9} {s['n']:>5} {s['lag_p50_ms']:>8} {s['lag_p95_ms']:>8} "
                f"{s['commits_per_s']:>9} {s['commits_per_s_per_stream']:>8} "
                f"{s['postgres_cpu_per_stream']:>9} {s['cpu_per_stream']:>8} "
                f"{s['connections_max']:>6} {s['connections_busy_max']:>5} {s['lost']:>5} "
                f"{s['duplicated']:>4} {s['failed']:>5}  {waits}"
            )
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
