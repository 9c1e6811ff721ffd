"""`make bench`: one run, figures for Parley beside a baseline measured in the same run.

(a) time from POST to the first `delta` event at the client, sequential turns;
(b) turns per second and full-turn latency with N concurrent sessions;
(c)-(e) conversational memory: tokens against resending the history, time to `done` with and
without summaries, LoCoMo evidence recall (bench/memory.py);
(f) knowledge retrieval: top-3 hit rate, full-text and hybrid (bench/knowledge.py);
(g) answer paths, (h) the first delta stage by stage; (i) regular expressions over long
hostile input (bench/regexes.py); (j) the workflow code's own CPU per turn, replayed
(bench/replay_cost.py).

The baseline is the same demo model streamed as SSE by a bare FastAPI endpoint (no Temporal,
no database; see bench/baseline.py). Both use the same demo token delay and the same client
code (bench/runner.py). Progress goes to stderr, the table to stdout, the figures as JSON to
.data/bench/latest.json.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import math
import os
import platform
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import httpx
from temporalio.client import Client

from bench.cpu import snapshot, usage
from bench.knowledge import measure_knowledge, render_knowledge
from bench.memory import measure_memory, render_memory
from bench.paths import measure_paths, render_paths
from bench.regexes import measure_regexes, render_regexes
from bench.replay_cost import measure_replay_cost, render_replay_cost
from bench.runner import (
    BaselineTarget,
    ParleyTarget,
    Target,
    concurrent,
    sequential,
    timed,
)
from bench.stack import REPO, Stack, log, running_stack
from bench.throughput import render_throughput, shapes, throughput
from bench.timeline import measure_timeline, render_timeline
from store.db import create_engine, session_factory


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--token-delay-ms", type=float, default=5.0, help="demo model delay per token (both)"
    )
    parser.add_argument(
        "--latency-turns", type=int, default=60, help="(a) sequential turns per system"
    )
    parser.add_argument(
        "--turns-per-session", type=int, default=5, help="(a) fresh session every N turns"
    )
    parser.add_argument(
        "--concurrency",
        type=lambda v: [int(c) for c in v.split(",")],
        default=[20, 50],
        help="(b) concurrent sessions, comma-separated: one table each",
    )
    parser.add_argument(
        "--throughput-turns", type=int, default=200, help="(b) total turns per row and table"
    )
    parser.add_argument("--no-memory", action="store_true", help="skip (c)-(e)")
    parser.add_argument("--path-turns", type=int, default=20, help="(g) turns per answer path")
    parser.add_argument(
        "--no-eager",
        action="store_true",
        help="Temporal without eager activity dispatch (as in a default server)",
    )
    parser.add_argument("--warmup-turns", type=int, default=5, help="untimed turns per system")
    parser.add_argument(
        "--memory-only", action="store_true", help="only the memory figures (c), (d), (e)"
    )
    parser.add_argument("--locomo-only", action="store_true", help="only (e)")
    parser.add_argument("--no-locomo", action="store_true", help="skip (e)")
    parser.add_argument(
        "--reading-pause-s", type=float, default=2.0, help="(d) pause after each answer"
    )
    parser.add_argument("--done-turns", type=int, default=15, help="(d) turns per row")
    parser.add_argument(
        "--locomo-share", type=float, default=0.11, help="(e) conversation budget / tokens"
    )
    parser.add_argument(
        "--locomo-data",
        type=lambda v: [Path(p) for p in v.split(",")],
        default=None,
        help="(e) LoCoMo files, comma-separated (default bench/data/locomo3.json; upstream "
        "locomo10.json or locomo10_v2/NN.json keep the photo captions)",
    )
    parser.add_argument(
        "--output", type=Path, default=REPO / ".data" / "bench" / "latest.json", help="JSON file"
    )
    return parser.parse_args(argv)


def ratio(a: float, b: float) -> float:
    return a / b if b and not math.isnan(a) and not math.isnan(b) else math.nan


def http_client(base_url: str, token: str | None, connections: int) -> httpx.AsyncClient:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.AsyncClient(
        base_url=base_url,
        headers=headers,
        timeout=httpx.Timeout(60.0),
        limits=httpx.Limits(max_connections=connections, max_keepalive_connections=connections),
    )


async def measure(args: argparse.Namespace, stack: Stack) -> dict[str, Any]:
    connections = 2 * max(args.concurrency) + 10
    async with (
        http_client(stack.parley_url, stack.token, connections) as parley_http,
        http_client(stack.baseline_url, None, connections) as baseline_http,
    ):
        parley = ParleyTarget(parley_http)
        baseline: Target = BaselineTarget(baseline_http)
        targets: list[Target] = [baseline, parley]

        # Warm-up: imports, connection pools, Temporal task queue. Untimed.
        warm_seq = sequential(targets, args.warmup_turns, args.warmup_turns, stack.check)
        warm = await timed("warm-up (sequential)", warm_seq, log)
        for name, phase in warm.items():
            if not any(t.ok for t in phase.turns):
                raise RuntimeError(f"{name}: no warm-up turn succeeded: {phase.report()}")
        for target in targets:
            await timed(
                f"warm-up ({target.name}, concurrent)",
                concurrent(target, max(args.concurrency), 1, stack.check),
                log,
            )

        log(f"(a) {args.latency_turns} sequential turns per system, interleaved")
        before = snapshot()
        seq = await timed(
            "(a) sequential",
            sequential(targets, args.latency_turns, args.turns_per_session, stack.check),
            log,
        )
        seq_cpu = usage(before, snapshot(), stack.roles())

        shape = await shapes(stack, parley)
        conc = {
            str(clients): await throughput(
                stack,
                baseline,
                parley,
                clients=clients,
                total_turns=args.throughput_turns,
                shape=shape,
            )
            for clients in args.concurrency
        }

    a = {name: phase.report() for name, phase in seq.items()}
    return {
        "sequential": {
            **a,
            "cpu_both_interleaved": seq_cpu,
            "ratio_parley_over_baseline": {
                "first_delta_p50": ratio(
                    a["parley"]["first_delta"]["p50_ms"], a["baseline"]["first_delta"]["p50_ms"]
                ),
                "first_delta_p95": ratio(
                    a["parley"]["first_delta"]["p95_ms"], a["baseline"]["first_delta"]["p95_ms"]
                ),
                "full_turn_p50": ratio(
                    a["parley"]["full_turn"]["p50_ms"], a["baseline"]["full_turn"]["p50_ms"]
                ),
            },
        },
        "shape": shape,
        "concurrent": conc,
    }


def fmt(value: float, digits: int = 1) -> str:
    return "n/a" if value is None or math.isnan(value) else f"{value:.{digits}f}"


def render(settings: dict[str, Any], results: dict[str, Any]) -> str:
    a, b = results["sequential"], results["concurrent"]
    lines: list[str] = []
    lines.append("Parley bench (one run; ratios are Parley / baseline measured in the same run)")
    lines.append("settings: " + ", ".join(f"{k}={v}" for k, v in settings.items()))
    lines.append("")

    header = (
        f"{'':<22}{'turns ok':>9}{'first-delta p50':>17}{'p95':>9}"
        f"{'full-turn p50':>15}{'p95':>9}{'deltas/turn':>13}"
    )
    lines.append(
        f"(a) Time from POST to first `delta` at the client, sequential turns "
        f"(ms; fresh session every {settings['turns_per_session']} turns)"
    )
    lines.append(header)
    for name in ("baseline", "parley"):
        r = a[name]
        lines.append(
            f"{name:<22}{r['ok']:>4}/{r['turns']:<4}"
            f"{fmt(r['first_delta']['p50_ms']):>17}{fmt(r['first_delta']['p95_ms']):>9}"
            f"{fmt(r['full_turn']['p50_ms']):>15}{fmt(r['full_turn']['p95_ms']):>9}"
            f"{fmt(r['delta_events_per_turn']):>13}"
        )
    ra = a["ratio_parley_over_baseline"]
    lines.append(
        f"{'ratio parley/baseline':<22}{'':>9}{fmt(ra['first_delta_p50'], 2) + 'x':>17}"
        f"{fmt(ra['first_delta_p95'], 2) + 'x':>9}{fmt(ra['full_turn_p50'], 2) + 'x':>15}"
    )
    lines.append("")

    for table in b.values():
        lines.extend(render_throughput(table, results["shape"]))
        lines.append("")
    lines.append(
        f"{settings['cpus']} cores; 'x base' = turns/s over the baseline's in the same table; "
        "the skeleton rows are Temporal's floor for a workflow of that many no-op activities; "
        "'lost' = event ids the client never received plus answers whose done text differs "
        "from their deltas"
    )
    for table in b.values():
        shares = [
            r["cpu"].get("other_cpu_s", 0.0) / r["wall_s"]
            for r in table["rows"].values()
            if r.get("wall_s")
        ]
        if shares and max(shares) > 0.1:
            lines.append(
                f"  note: processes outside this bench used {min(shares) * 100:.0f}-"
                f"{max(shares) * 100:.0f}% of a core during the {table['clients']}-session rows; "
                "their figures are disturbed by that load"
            )
    for name in ("baseline", "parley"):
        for error in a[name].get("first_errors", []):
            lines.append(f"(a) {name} failure: {error}")
    return "\n".join(lines)


async def main_async(args: argparse.Namespace) -> None:
    started = time.perf_counter()
    async with running_stack(args.token_delay_ms, eager=not args.no_eager) as stack:
        settings = {
            "demo_token_delay_ms": args.token_delay_ms,
            "parley_stream_frame_ms": stack.settings.stream_frame_ms,
            "latency_turns": args.latency_turns,
            "turns_per_session": args.turns_per_session,
            "concurrency": args.concurrency,
            "throughput_turns_per_row": args.throughput_turns,
            "warmup_turns": args.warmup_turns,
            "eager_activities": not args.no_eager,
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
        }
        memory_only = args.memory_only or args.locomo_only
        results = {} if memory_only else await measure(args, stack)
        if not memory_only and args.path_turns:
            results["paths"] = await _paths(args, stack)
            results["timeline"] = await _timeline(args, stack)
        if not args.no_memory:
            results["memory"] = await _memory(args, stack)
            results["knowledge"] = await _knowledge(stack)
    if not memory_only:
        log("(i) regular expressions over long hostile runs")
        results["regexes"] = measure_regexes()
        log("(j) workflow code per turn, replayed")
        results["replay_cost"] = await measure_replay_cost()
    _write(args, settings, results, started)


async def _memory(args: argparse.Namespace, stack: Stack) -> dict[str, Any]:
    engine = create_engine(stack.settings.database_url or "", pool_size=2)
    try:
        log("(c)-(e) memory: token table, time to done, LoCoMo")
        return await measure_memory(
            stack.parley_url,
            stack.token,
            stack.settings,
            session_factory(engine),
            done_turns=args.done_turns,
            reading_pause_s=args.reading_pause_s,
            locomo_share=args.locomo_share,
            locomo_only=args.locomo_only,
            locomo=not args.no_locomo,
            locomo_data=args.locomo_data,
        )
    finally:
        await engine.dispose()


async def _paths(args: argparse.Namespace, stack: Stack) -> dict[str, Any]:
    engine = create_engine(stack.settings.database_url or "", pool_size=2)
    try:
        log(f"(g) answer paths: {args.path_turns} turns each, interleaved")
        async with http_client(stack.parley_url, stack.token, 4) as http:
            return await measure_paths(
                ParleyTarget(http), session_factory(engine), turns=args.path_turns
            )
    finally:
        await engine.dispose()


async def _timeline(args: argparse.Namespace, stack: Stack) -> dict[str, Any]:
    engine = create_engine(stack.settings.database_url or "", pool_size=2)
    try:
        log(f"(h) the first delta stage by stage: {args.path_turns} plain turns")
        temporal = await Client.connect(stack.settings.temporal_address)
        async with http_client(stack.parley_url, stack.token, 4) as http:
            return await measure_timeline(
                ParleyTarget(http),
                session_factory(engine),
                temporal,
                turns=args.path_turns,
                skeleton_queue=stack.skeleton_queue,
            )
    finally:
        await engine.dispose()


async def _knowledge(stack: Stack) -> dict[str, Any]:
    engine = create_engine(stack.settings.database_url or "", pool_size=2)
    try:
        log("(f) knowledge retrieval: top-3 hit rate, full-text and hybrid")
        return await measure_knowledge(session_factory(engine))
    finally:
        await engine.dispose()


def _write(
    args: argparse.Namespace, settings: dict[str, Any], results: dict[str, Any], started: float
) -> None:
    settings["bench_runtime_s"] = round(time.perf_counter() - started, 1)
    if "sequential" in results:
        print(render(settings, results))
    if "paths" in results:
        print(render_paths(results["paths"]))
    if "timeline" in results:
        print(render_timeline(results["timeline"]))
    if "memory" in results:
        print(render_memory(results["memory"]))
    if "knowledge" in results:
        print(render_knowledge(results["knowledge"]))
    if "regexes" in results:
        print(render_regexes(results["regexes"]))
    if "replay_cost" in results:
        print(render_replay_cost(results["replay_cost"]))
    args.output.parent.mkdir(parents=True, exist_ok=True)
    document = {
        "measured_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "settings": settings,
        "baseline": "DemoModel streamed as SSE by a bare FastAPI app (bench/baseline.py)",
        "results": results,
    }
    args.output.write_text(json.dumps(document, indent=2, default=str) + "\n")
    print(f"\nfigures written to {args.output}")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR is not set")
    try:
        asyncio.run(main_async(args))
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
