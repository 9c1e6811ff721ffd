"""`make bench`: one run, figures for Parley beside a baseline measured in the same run.

(a) time from POST to the first `delta` event at the client, sequential turns (bench/latency.py);
(t) the same in a session of 600 imported messages, where recall runs, embeddings on and off
(bench/recall_latency.py; alone with `--recall-latency-only`);
(b) turns per second and full-turn latency with N concurrent sessions, beside Temporal's own
floor (bench/throughput.py, bench/skeleton.py);
(c)-(e) conversational memory: tokens against resending the history, time to `done` with and
without summaries, LoCoMo evidence recall (bench/memory.py); (c) has a row with a
summarizer that fails, through OpenAI's wire format (bench/plain_summarizer.py);
(f) knowledge retrieval: top-3 hit rate, full-text and hybrid (bench/knowledge.py);
(g) answer paths, (h) the first delta stage by stage; (k) Stop mid-answer (bench/stop.py);
(r) a card confirmed by one client, seen on another's session stream (bench/live.py);
(l) open-loop load at half the plain-turn capacity of (b), and the floors under the same
kind of load (bench/open_loop.py); then, with
the stack down, (i) regular expressions over long hostile input (bench/regexes.py), (j) the
workflow code's own CPU per turn, replayed (bench/replay_cost.py), (m) eager workflow start
on a dev server of its own (bench/eager_start.py); last, issue 45's acceptance figures in
one block (bench/acceptance.py), after (u) the stream-scale ceiling, this checkout beside issue
45's starting commit on stacks of their own (bench/stream_scale.py; alone with
`python -m bench.stream_scale`). Not in the default run: (n) LoCoMo conversation 50 posted
through the API with a summarizer that answers in prose (`--locomo-api`, alone with
`--locomo-api-only`; bench/locomo_api.py); (o) the ten LoCoMo conversations imported through
`POST .../import` and questioned, and (p) the import's speed (`--locomo-import`, alone with
`--locomo-import-only`; bench/locomo_import.py); (q) the chaos soak, mixed turns under
`make run`'s supervisor while a component is killed every 20-30 s (`--chaos`, alone with
`--chaos-only`; bench/chaos.py); (s) what Anthropic's prompt cache saves on the standing
prompt (offline arithmetic; bench/prompt_cache.py).

The baseline is the same demo model streamed as SSE by a bare FastAPI endpoint (no Temporal,
no database; see bench/baseline.py). Both use the same demo token delay and the same client
code (bench/runner.py). Each section runs in its own guard (bench/sections.py): one that fails
prints its error and the others still run. Progress goes to stderr, the tables to stdout, the
figures as JSON to .data/bench/latest.json, written even when a section failed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import sys
import time
import warnings
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
from temporalio.client import Client

from bench.acceptance import render_acceptance
from bench.chaos import measure_chaos, render_chaos
from bench.eager_start import measure_eager_start, render_eager_start
from bench.knowledge import measure_knowledge, render_knowledge
from bench.latency import measure_sequential, render_sequential, warm_up
from bench.live import measure_live, render_live
from bench.locomo_api import measure_locomo_api, render_locomo_api
from bench.locomo_import import (
    add_arguments,
    check_arguments,
    measure_import_speed,
    measure_locomo_import,
    render_import_speed,
    render_locomo_import,
)
from bench.memory import measure_memory, render_memory
from bench.open_loop import (
    FLOOR_SHARE,
    floor_capacities,
    measure_floors,
    measure_open_loop,
    plain_capacity,
    render_floors,
    render_open_loop,
)
from bench.paths import measure_paths, render_paths
from bench.plain_summarizer import failing_summarizer_row
from bench.prompt_cache import measure_prompt_cache, render_prompt_cache
from bench.recall_latency import measure_recall_latency, render_recall_latency
from bench.regexes import measure_regexes, render_regexes
from bench.replay_cost import measure_replay_cost, render_replay_cost
from bench.runner import BaselineTarget, ParleyTarget, Target
from bench.sections import (
    Section,
    failed,
    failure,
    guarded,
    needed,
    render_sections,
    run_sections,
    write_document,
)
from bench.stack import REPO, Stack, log, running_stack
from bench.stop import measure_stop, render_stop
from bench.stream_scale import add_scale_arguments, render_stream_scale, stream_scale
from bench.throughput import render_concurrent, shapes, throughput
from bench.timeline import measure_timeline, render_timeline
from parley.store.db import Database, create_engine

# `--quick`: every section, with counts small enough for a smoke run of a few minutes. Flags
# given as well still win.
QUICK = {
    "latency_turns": 6,
    "warmup_turns": 2,
    "concurrency": [20],
    "throughput_turns": 40,
    "path_turns": 3,
    "done_turns": 2,
    "reading_pause_s": 0.2,
    "stop_tries": 5,
    "live_tries": 3,
    "open_loop_s": 5.0,
    "eager_runs": 10,
    "recall_latency_turns": 3,
    "stream_scale_answer_s": 4.0,
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="small counts everywhere: a smoke run (see QUICK)"
    )
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
    parser.add_argument("--no-memory", action="store_true", help="skip (c)-(f)")
    parser.add_argument("--path-turns", type=int, default=20, help="(g), (h) turns per row")
    parser.add_argument(
        "--no-eager",
        action="store_true",
        help="Temporal without eager activity dispatch (as in a default server)",
    )
    parser.add_argument("--warmup-turns", type=int, default=5, help="untimed turns per system")
    parser.add_argument(
        "--memory-only", action="store_true", help="only the memory figures (c)-(f)"
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
        "--locomo-api",
        action="store_true",
        help="(n) also LoCoMo conversation 50 through the API, summarizer failing (slow)",
    )
    parser.add_argument("--locomo-api-only", action="store_true", help="only (n)")
    parser.add_argument(
        "--locomo-api-sessions", type=int, default=15, help="(n) LoCoMo sessions posted"
    )
    parser.add_argument(
        "--recall-latency-turns",
        type=int,
        default=20,
        help="(t) plain turns per system in a long session, embeddings on and off (0: skip)",
    )
    parser.add_argument("--recall-latency-only", action="store_true", help="only (t)")
    parser.add_argument("--stop-tries", type=int, default=20, help="(k) Stops mid-answer")
    parser.add_argument(
        "--live-tries", type=int, default=10, help="(r) confirms seen by a second client"
    )
    parser.add_argument(
        "--open-loop-s", type=float, default=60.0, help="(l) seconds of open-loop arrivals"
    )
    parser.add_argument(
        "--eager-runs", type=int, default=60, help="(m) workflows per eager-start mode"
    )
    parser.add_argument(
        "--output", type=Path, default=REPO / ".data" / "bench" / "latest.json", help="JSON file"
    )
    parser.add_argument(
        "--chaos", action="store_true", help="(q) also the chaos soak, last (minutes)"
    )
    parser.add_argument("--chaos-only", action="store_true", help="only (q)")
    parser.add_argument("--chaos-s", type=float, default=300.0, help="(q) seconds of kills")
    parser.add_argument("--chaos-sessions", type=int, default=20, help="(q) sessions running turns")
    parser.add_argument(
        "--no-offline", action="store_true", help="skip (i), (j), (m), (s) and (u): the live ones"
    )
    add_arguments(parser)
    add_scale_arguments(parser)
    if "--quick" in (sys.argv[1:] if argv is None else argv):
        parser.set_defaults(**QUICK)
    args = parser.parse_args(argv)
    check_arguments(parser, args)
    return args


def chaos_section(args: argparse.Namespace) -> Section:
    """(q): on a `parley dev` of its own, not the bench's stack."""
    return Section(
        "chaos",
        lambda: measure_chaos(sessions=args.chaos_sessions, duration_s=args.chaos_s),
        render_chaos,
    )


def live_only(args: argparse.Namespace) -> bool:
    """A run of memory sections alone: no latency or load sections, no offline ones."""
    return bool(
        args.memory_only
        or args.locomo_only
        or args.locomo_api_only
        or args.locomo_import_only
        or args.import_speed_only
        or args.recall_latency_only
    )


def shown_path(path: Path) -> str:
    """`path` as the report prints it: relative to the repository when inside it, so a report
    pasted into the docs names no machine's folders."""
    resolved = path.resolve()
    return str(resolved.relative_to(REPO)) if resolved.is_relative_to(REPO) else str(path)


def http_client(base_url: str, token: str | None, connections: int) -> httpx.AsyncClient:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.AsyncClient(
        base_url=base_url,
        headers=headers,
        timeout=httpx.Timeout(60.0),
        limits=httpx.Limits(max_connections=connections, max_keepalive_connections=connections),
    )


@asynccontextmanager
async def database(stack: Stack) -> AsyncIterator[Database]:
    """A small engine of the bench's own on the stack's database, disposed on exit."""
    engine = create_engine(stack.settings.database_url or "", pool_size=2)
    try:
        yield Database(engine)
    finally:
        await engine.dispose()


def live_sections(
    args: argparse.Namespace,
    stack: Stack,
    parley: ParleyTarget,
    baseline: Target,
    results: dict[str, Any],
) -> list[Section]:
    """The sections that need the running stack, in the order they run and print."""
    targets = [baseline, parley]
    sections = [
        Section(
            "warm_up",
            lambda: warm_up(targets, stack, turns=args.warmup_turns, clients=max(args.concurrency)),
        ),
        Section(
            "sequential",
            lambda: measure_sequential(
                targets, stack, turns=args.latency_turns, turns_per_session=args.turns_per_session
            ),
            render_sequential,
        ),
    ]
    if args.recall_latency_turns:
        sections.append(recall_latency_section(args, stack, baseline))
    sections += [
        Section("shape", lambda: shapes(stack, parley)),
        Section(
            "concurrent",
            lambda: _concurrent(args, stack, baseline, parley, needed(results, "shape")),
            lambda tables: render_concurrent(tables, results["shape"]),
        ),
    ]
    if args.path_turns:
        sections += [
            Section("paths", lambda: _paths(args, stack), render_paths),
            Section("timeline", lambda: _timeline(args, stack), render_timeline),
        ]
    if args.stop_tries:
        sections.append(
            Section("stop", lambda: measure_stop(parley.http, tries=args.stop_tries), render_stop)
        )
    if args.live_tries:
        sections.append(
            Section("live", lambda: measure_live(parley.http, tries=args.live_tries), render_live)
        )
    if args.open_loop_s:
        sections.append(
            Section(
                "open_loop",
                lambda: measure_open_loop(
                    parley,
                    stack,
                    capacity=plain_capacity(needed(results, "concurrent")),
                    unloaded_p50_ms=needed(results, "sequential")["parley"]["first_delta"][
                        "p50_ms"
                    ],
                    duration_s=args.open_loop_s,
                    turns_per_session=args.turns_per_session,
                ),
                render_open_loop,
            )
        )
        sections.append(
            Section(
                "open_loop_floors",
                lambda: measure_floors(
                    baseline,
                    stack,
                    floor_capacities(
                        needed(results, "concurrent"),
                        plain_capacity(needed(results, "concurrent")),
                    ),
                    baseline_unloaded_p50_ms=needed(results, "sequential")["baseline"][
                        "first_delta"
                    ]["p50_ms"],
                    duration_s=args.open_loop_s * FLOOR_SHARE,
                ),
                render_floors,
            )
        )
    return sections


def recall_latency_section(args: argparse.Namespace, stack: Stack, baseline: Target) -> Section:
    """(t): the first delta in a long session, embeddings on and off, beside the baseline."""

    async def measure() -> dict[str, Any]:
        async with database(stack) as db_sessions:
            return await measure_recall_latency(
                stack, db_sessions, baseline, turns=args.recall_latency_turns
            )

    return Section("recall_latency", measure, render_recall_latency)


def memory_sections(args: argparse.Namespace, stack: Stack) -> list[Section]:
    """The memory sections asked for: (c)-(f) unless left out, then (n), (o) and (p) when
    asked (each `--...-only` flag runs its own alone)."""
    only = (
        args.locomo_api_only
        or args.locomo_import_only
        or args.import_speed_only
        or args.recall_latency_only
    )
    sections = []
    if not (only or args.no_memory):
        sections += [
            Section("memory", lambda: _memory(args, stack), render_memory),
            Section("knowledge", lambda: _knowledge(stack), render_knowledge),
        ]
    if args.locomo_api_only or (args.locomo_api and not only):
        sections.append(Section("locomo_api", lambda: _locomo_api(args, stack), render_locomo_api))
    if args.locomo_import_only or args.import_speed_only or (args.locomo_import and not only):
        sections.append(
            Section("import_speed", lambda: _import_speed(args, stack), render_import_speed)
        )
    if args.locomo_import_only or (args.locomo_import and not only):
        sections.append(
            Section("locomo_import", lambda: _locomo_import(args, stack), render_locomo_import)
        )
    return sections


def offline_sections(args: argparse.Namespace) -> list[Section]:
    """The sections that need no stack: they run after it is down."""
    return [
        Section("regexes", _regexes, render_regexes),
        Section("replay_cost", _replay_cost, render_replay_cost),
        Section("eager_start", lambda: _eager_start(args), render_eager_start),
        Section("prompt_cache", _prompt_cache, render_prompt_cache),
        Section("stream_scale", lambda: stream_scale(args), render_stream_scale),
    ]


async def _concurrent(
    args: argparse.Namespace,
    stack: Stack,
    baseline: Target,
    parley: ParleyTarget,
    shape: dict[str, dict[str, Any]],
) -> dict[str, Any]:
    return {
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


async def _paths(args: argparse.Namespace, stack: Stack) -> dict[str, Any]:
    log(f"(g) answer paths: {args.path_turns} turns each, interleaved")
    async with database(stack) as db_sessions, http_client(stack.parley_url, stack.token, 4) as h:
        return await measure_paths(ParleyTarget(h), db_sessions, turns=args.path_turns)


async def _timeline(args: argparse.Namespace, stack: Stack) -> dict[str, Any]:
    log(f"(h) the first delta stage by stage: {args.path_turns} plain turns")
    temporal = await Client.connect(stack.settings.temporal_address)
    async with database(stack) as db_sessions, http_client(stack.parley_url, stack.token, 4) as h:
        return await measure_timeline(
            ParleyTarget(h),
            db_sessions,
            temporal,
            turns=args.path_turns,
            skeleton_queue=stack.skeleton_queue,
        )


async def _memory(args: argparse.Namespace, stack: Stack) -> dict[str, Any]:
    log("(c)-(e) memory: token table, time to done, LoCoMo")
    async with database(stack) as db_sessions:
        figures = await measure_memory(
            stack.parley_url,
            stack.token,
            stack.settings,
            db_sessions,
            done_turns=args.done_turns,
            reading_pause_s=args.reading_pause_s,
            locomo_share=args.locomo_share,
            locomo_only=args.locomo_only,
            locomo=not args.no_locomo,
            locomo_data=args.locomo_data,
        )
        if not args.locomo_only and isinstance(figures["tokens"], list):
            log("(c) the 50-turn conversation again, the summarizer answering in prose")
            row = await guarded(
                "memory (c) plain", lambda: failing_summarizer_row(stack, db_sessions, 50)
            )
            if failed(row):  # its error is shown under the table; the other rows stand
                figures["tokens_plain"] = row
            else:
                figures["tokens"].append(row)
        return figures


async def _locomo_api(args: argparse.Namespace, stack: Stack) -> dict[str, Any]:
    log("(n) LoCoMo conversation 50 through the API, the summarizer answering in prose")
    async with database(stack) as db_sessions:
        return await measure_locomo_api(stack, db_sessions, sessions=args.locomo_api_sessions)


async def _locomo_import(args: argparse.Namespace, stack: Stack) -> dict[str, Any]:
    log(f"(o) LoCoMo imported through the API, from {args.locomo_dir}")
    async with database(stack) as db_sessions:
        return await measure_locomo_import(
            stack, db_sessions, folder=args.locomo_dir, names=args.locomo_import_convs
        )


async def _import_speed(args: argparse.Namespace, stack: Stack) -> dict[str, Any]:
    log(f"(p) import speed: {args.import_speed_messages} messages in one request")
    async with database(stack) as db_sessions:
        return await measure_import_speed(stack, db_sessions, messages=args.import_speed_messages)


async def _knowledge(stack: Stack) -> dict[str, Any]:
    log("(f) knowledge retrieval: top-3 hit rate, full-text and hybrid")
    async with database(stack) as db_sessions:
        return await measure_knowledge(db_sessions)


async def _regexes() -> dict[str, Any]:
    log("(i) regular expressions over long hostile runs")
    return measure_regexes()


async def _prompt_cache() -> dict[str, Any]:
    log("(s) Anthropic's prompt cache on the standing prompt")
    return measure_prompt_cache()


async def _replay_cost() -> dict[str, Any]:
    log("(j) workflow code per turn, replayed")
    return await measure_replay_cost()


async def _eager_start(args: argparse.Namespace) -> dict[str, Any]:
    log(f"(m) eager workflow start: {args.eager_runs} workflows per mode, own dev server")
    return await measure_eager_start(runs=args.eager_runs)


def run_settings(args: argparse.Namespace) -> dict[str, Any]:
    if args.chaos_only:  # (q) prints its own settings; the others' would only mislead
        return {"cpus": os.cpu_count(), "python": platform.python_version()}
    return {
        "demo_token_delay_ms": args.token_delay_ms,
        "latency_turns": args.latency_turns,
        "turns_per_session": args.turns_per_session,
        "concurrency": args.concurrency,
        "throughput_turns_per_row": args.throughput_turns,
        "warmup_turns": args.warmup_turns,
        "stop_tries": args.stop_tries,
        "live_tries": args.live_tries,
        "open_loop_s": args.open_loop_s,
        "eager_activities": not args.no_eager,
        "quick": args.quick,
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
    }


async def run_live(
    args: argparse.Namespace,
    settings: dict[str, Any],
    results: dict[str, Any],
    shown: list[Section],
) -> None:
    """Bring the stack up, run the sections that need it, take it down. A stack that does
    not come up (or down) is itself a failed section: the offline ones still run."""
    memory_only = live_only(args)
    try:
        async with running_stack(args.token_delay_ms, eager=not args.no_eager) as stack:
            settings["parley_stream_frame_ms"] = stack.settings.stream_frame_ms
            connections = 2 * max(args.concurrency) + 10
            async with (
                http_client(stack.parley_url, stack.token, connections) as parley_http,
                http_client(stack.baseline_url, None, connections) as baseline_http,
            ):
                parley, baseline = ParleyTarget(parley_http), BaselineTarget(baseline_http)
                sections = (
                    [] if memory_only else live_sections(args, stack, parley, baseline, results)
                )
                if args.recall_latency_only:
                    sections.append(recall_latency_section(args, stack, baseline))
                sections += memory_sections(args, stack)
                shown.extend(sections)
                await run_sections(sections, results)
    except Exception as exc:
        results["stack"] = failure("stack", exc)


async def main_async(args: argparse.Namespace) -> None:
    started = time.perf_counter()
    settings = run_settings(args)
    results: dict[str, Any] = {}
    shown: list[Section] = []
    try:
        if not args.chaos_only:
            await run_live(args, settings, results, shown)
        if not (live_only(args) or args.chaos_only or args.no_offline):
            offline = offline_sections(args)
            shown.extend(offline)
            await run_sections(offline, results)
        if args.chaos or args.chaos_only:
            shown.append(chaos_section(args))
            await run_sections(shown[-1:], results)
    finally:
        settings["bench_runtime_s"] = round(time.perf_counter() - started, 1)
        print("Parley bench (one run; ratios are Parley / baseline measured in the same run)")
        print("settings: " + ", ".join(f"{k}={v}" for k, v in settings.items()))
        print(render_sections(shown, results))
        if "stack" in results:
            print(f"\nstack: FAILED: {results['stack']['error']}")
        if not (live_only(args) or args.chaos_only):
            print(render_acceptance(results))
        write_document(args.output, settings, results)
        print(f"\nfigures written to {shown_path(args.output)}")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR is not set")
    try:
        asyncio.run(main_async(args))
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
