"""`make bench`: one run, figures for Parley beside a baseline measured in the same run.

(a) time from POST to the first `delta` event at the client, sequential turns;
(b) turns per second and full-turn latency with N concurrent sessions;
(c)-(e) conversational memory: tokens against resending the history, time to `done` with and
without summaries, LoCoMo evidence recall (bench/memory.py);
(f) knowledge retrieval: top-3 hit rate, full-text and hybrid (bench/knowledge.py).

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

from bench.cpu import snapshot, usage
from bench.knowledge import measure_knowledge, render_knowledge
from bench.memory import measure_memory, render_memory
from bench.runner import (
    BaselineTarget,
    ParleyTarget,
    Phase,
    Target,
    concurrent,
    sequential,
    timed,
)
from bench.stack import REPO, Stack, log, running_stack
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
    parser.add_argument("--concurrency", type=int, default=20, help="(b) concurrent sessions")
    parser.add_argument(
        "--throughput-turns", type=int, default=200, help="(b) total turns per system"
    )
    parser.add_argument("--warmup-turns", type=int, default=5, help="untimed turns per system")
    parser.add_argument(
        "--memory-only", action="store_true", help="only the memory figures (c), (d), (e)"
    )
    parser.add_argument("--locomo-only", action="store_true", help="only (e)")
    parser.add_argument(
        "--locomo-share", type=float, default=0.11, help="(e) conversation budget / tokens"
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
    connections = 2 * args.concurrency + 10
    async with (
        http_client(stack.parley_url, stack.token, connections) as parley_http,
        http_client(stack.baseline_url, None, connections) as baseline_http,
    ):
        parley: Target = ParleyTarget(parley_http)
        baseline: Target = BaselineTarget(baseline_http)
        targets = [baseline, parley]

        # Warm-up: imports, connection pools, Temporal task queue. Untimed.
        warm_seq = sequential(targets, args.warmup_turns, args.warmup_turns, stack.check)
        warm = await timed("warm-up (sequential)", warm_seq, log)
        for name, phase in warm.items():
            if not any(t.ok for t in phase.turns):
                raise RuntimeError(f"{name}: no warm-up turn succeeded: {phase.report()}")
        for target in targets:
            await timed(
                f"warm-up ({target.name}, concurrent)",
                concurrent(target, args.concurrency, 1, stack.check),
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

        per_client = math.ceil(args.throughput_turns / args.concurrency)
        log(f"(b) {args.concurrency} concurrent clients x {per_client} turns per system")
        conc: dict[str, Phase] = {}
        conc_cpu: dict[str, dict[str, Any]] = {}
        for target in targets:
            before = snapshot()
            conc[target.name] = await timed(
                f"(b) {target.name}",
                concurrent(target, args.concurrency, per_client, stack.check),
                log,
            )
            conc_cpu[target.name] = usage(before, snapshot(), stack.roles())
        stack.check()

    a = {name: phase.report() for name, phase in seq.items()}
    b = {name: phase.report() | {"cpu": conc_cpu[name]} for name, phase in conc.items()}
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
        "concurrent": {
            **b,
            "clients": args.concurrency,
            "turns_per_client": per_client,
            "ratio_parley_over_baseline": {
                "turns_per_s": ratio(b["parley"]["turns_per_s"], b["baseline"]["turns_per_s"]),
                "full_turn_p50": ratio(
                    b["parley"]["full_turn"]["p50_ms"], b["baseline"]["full_turn"]["p50_ms"]
                ),
                "full_turn_p95": ratio(
                    b["parley"]["full_turn"]["p95_ms"], b["baseline"]["full_turn"]["p95_ms"]
                ),
            },
        },
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

    lines.append(
        f"(b) Throughput, {b['clients']} concurrent sessions x {b['turns_per_client']} turns "
        f"back to back (latencies in ms)"
    )
    lines.append(
        f"{'':<22}{'turns ok':>9}{'wall s':>8}{'turns/s':>9}"
        f"{'full-turn p50':>15}{'p95':>9}{'first-delta p50':>17}{'p95':>9}"
    )
    for name in ("baseline", "parley"):
        r = b[name]
        lines.append(
            f"{name:<22}{r['ok']:>4}/{r['turns']:<4}{fmt(r['wall_s']):>8}"
            f"{fmt(r['turns_per_s'], 2):>9}"
            f"{fmt(r['full_turn']['p50_ms']):>15}{fmt(r['full_turn']['p95_ms']):>9}"
            f"{fmt(r['first_delta']['p50_ms']):>17}{fmt(r['first_delta']['p95_ms']):>9}"
        )
    rb = b["ratio_parley_over_baseline"]
    lines.append(
        f"{'ratio parley/baseline':<22}{'':>9}{'':>8}{fmt(rb['turns_per_s'], 3) + 'x':>9}"
        f"{fmt(rb['full_turn_p50'], 2) + 'x':>15}{fmt(rb['full_turn_p95'], 2) + 'x':>9}"
    )
    lines.append("")
    lines.append(
        f"CPU seconds spent during each (b) run, by process ({settings['cpus']} cores = "
        f"{settings['cpus']} CPU-s per wall second; 'other' = processes this bench did not start)"
    )
    for name in ("baseline", "parley"):
        cpu = b[name]["cpu"]
        parts = [
            f"{role.removesuffix('_cpu_s')} {value:.1f}"
            for role, value in cpu.items()
            if role.endswith("_cpu_s") and value >= 0.05
        ]
        busy = cpu.get("machine_busy_fraction")
        busy_text = f"; machine busy {busy * 100:.0f}%" if busy is not None else ""
        lines.append(f"  {name:<9} " + ", ".join(parts) + busy_text)
        other, wall = cpu.get("other_cpu_s", 0.0), b[name]["wall_s"]
        if wall and other / wall > 0.1:
            lines.append(
                f"  note: processes outside this bench ({', '.join(cpu['other_top'])}) used "
                f"{other / wall * 100:.0f}% of a core during the {name} run; "
                "its figures are disturbed by that load"
            )
    for section, data in (("a", a), ("b", b)):
        for name in ("baseline", "parley"):
            for error in data[name].get("first_errors", []):
                lines.append(f"({section}) {name} failure: {error}")
    return "\n".join(lines)


async def main_async(args: argparse.Namespace) -> None:
    started = time.perf_counter()
    async with running_stack(args.token_delay_ms) as stack:
        settings = {
            "demo_token_delay_ms": args.token_delay_ms,
            "parley_stream_frame_ms": stack.settings.stream_frame_ms,
            "latency_turns": args.latency_turns,
            "turns_per_session": args.turns_per_session,
            "concurrency": args.concurrency,
            "throughput_turns": math.ceil(args.throughput_turns / args.concurrency)
            * args.concurrency,
            "warmup_turns": args.warmup_turns,
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
        }
        memory_only = args.memory_only or args.locomo_only
        results = {} if memory_only else await measure(args, stack)
        engine = create_engine(stack.settings.database_url or "", pool_size=2)
        try:
            log("(c)-(e) memory: token table, time to done, LoCoMo")
            results["memory"] = await measure_memory(
                stack.parley_url,
                stack.token,
                stack.settings,
                session_factory(engine),
                locomo_share=args.locomo_share,
                locomo_only=args.locomo_only,
            )
            log("(f) knowledge retrieval: top-3 hit rate, full-text and hybrid")
            results["knowledge"] = await measure_knowledge(session_factory(engine))
        finally:
            await engine.dispose()
    elapsed = time.perf_counter() - started
    settings["bench_runtime_s"] = round(elapsed, 1)

    if "sequential" in results:
        print(render(settings, results))
    print(render_memory(results["memory"]))
    print(render_knowledge(results["knowledge"]))
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
