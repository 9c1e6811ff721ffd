"""(l) Open-loop load (issue 25, acceptance 4): plain turns arriving at half the plain-turn
capacity measured in (b) of the same run, for `--open-loop-s` seconds, and the first `delta`
under that load beside the unloaded p50 of (a).

The throughput tables are closed loops: each session waits for its answer before the next
message, so a slower system is simply sent less and never sees a queue build. Here turns
arrive on a fixed schedule whatever the system does, as users arrive: a Poisson process
(exponential gaps, drawn from a fixed seed, so every run sends the same schedule). Each turn
takes a session no turn is running in (a session runs one turn at a time) from a pool made
before the clock; when every session is busy, a new one joins the pool. The client's lag
behind the schedule is reported, so a client that could not keep up is seen, not hidden.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from typing import Any

from bench.runner import ParleyTarget, Phase, run_turn, turn_text
from bench.stack import Stack, log
from bench.throughput import fmt, ratio

SEED = 25  # the number: one fixed schedule for every run
POOL_SECONDS = 5.0  # sessions made before the clock: enough for this many seconds of arrivals


def arrival_times(rate: float, duration_s: float, rng: random.Random) -> list[float]:
    """Seconds from the start at which turns arrive: a Poisson process of `rate` per second,
    cut at `duration_s`."""
    times: list[float] = []
    at = rng.expovariate(rate)
    while at < duration_s:
        times.append(at)
        at += rng.expovariate(rate)
    return times


def plain_capacity(tables: dict[str, Any]) -> tuple[float, str]:
    """The most plain turns per second any table of (b) measured, and in which table."""
    clients, rate = max(
        ((c, t["rows"]["parley plain"]["turns_per_s"]) for c, t in tables.items()),
        key=lambda item: item[1],
    )
    return rate, f"{clients} concurrent sessions"


async def measure_open_loop(
    parley: ParleyTarget,
    stack: Stack,
    *,
    capacity: tuple[float, str],
    unloaded_p50_ms: float,
    duration_s: float,
) -> dict[str, Any]:
    rate = capacity[0] / 2
    arrivals = arrival_times(rate, duration_s, random.Random(SEED))
    log(f"(l) open loop: {len(arrivals)} plain turns at {rate:.2f}/s for {duration_s:g} s")
    stack.check()
    pool = await _session_pool(parley, math.ceil(rate * POOL_SECONDS) + 2)
    phase, lags, added = await _arrive(parley, pool, arrivals)
    stack.check()
    report = phase.report()
    first = report["first_delta"]
    return {
        "capacity_turns_per_s": capacity[0],
        "capacity_from": capacity[1],
        "rate_per_s": rate,
        "duration_s": duration_s,
        "arrivals": len(arrivals),
        "turns": report,
        "unloaded_first_delta_p50_ms": unloaded_p50_ms,
        "first_delta_p50_over_unloaded_p50": ratio(first["p50_ms"], unloaded_p50_ms),
        "first_delta_p95_over_unloaded_p50": ratio(first["p95_ms"], unloaded_p50_ms),
        "client_start_lag_max_ms": max(lags, default=0.0) * 1000,
        "sessions_added": added,
    }


async def _session_pool(parley: ParleyTarget, size: int) -> asyncio.Queue[str]:
    pool: asyncio.Queue[str] = asyncio.Queue()
    for conversation in await asyncio.gather(*(parley.new_conversation() for _ in range(size))):
        pool.put_nowait(conversation)
    return pool


async def _arrive(
    parley: ParleyTarget, pool: asyncio.Queue[str], arrivals: list[float]
) -> tuple[Phase, list[float], int]:
    """Start each turn at its time without waiting for earlier ones; return the turns, how
    late the client started each, and how many sessions had to join the pool."""
    phase, lags, added = Phase(), [], 0

    async def turn(i: int) -> None:
        nonlocal added
        if pool.empty():
            added += 1
            pool.put_nowait(await parley.new_conversation())
        conversation = pool.get_nowait()
        phase.turns.append(await run_turn(parley, conversation, turn_text(i)))
        pool.put_nowait(conversation)

    started = time.perf_counter()
    running = []
    for i, at in enumerate(arrivals):
        await asyncio.sleep(max(0.0, started + at - time.perf_counter()))
        lags.append(time.perf_counter() - started - at)
        running.append(asyncio.create_task(turn(i)))
    await asyncio.gather(*running)
    phase.wall_s = time.perf_counter() - started
    return phase, lags, added


def render_open_loop(results: dict[str, Any]) -> str:
    turns = results["turns"]
    first, full = turns["first_delta"], turns["full_turn"]
    return "\n".join(
        [
            "",
            f"(l) Open-loop load: plain turns arriving at {results['rate_per_s']:.2f}/s (half "
            f"the {results['capacity_turns_per_s']:.2f}/s plain capacity of (b), "
            f"{results['capacity_from']}), Poisson, {results['duration_s']:g} s",
            f"  {'':<26}{'p50':>8}{'p95':>8}{'x unloaded p50':>16}",
            f"  {'first delta under load':<26}{fmt(first['p50_ms']):>8}{fmt(first['p95_ms']):>8}"
            f"{fmt(results['first_delta_p50_over_unloaded_p50'], 2) + 'x':>10}"
            f"{fmt(results['first_delta_p95_over_unloaded_p50'], 2) + 'x':>8} (p50, p95)",
            f"  {'first delta unloaded (a)':<26}{fmt(results['unloaded_first_delta_p50_ms']):>8}",
            f"  {'full turn under load':<26}{fmt(full['p50_ms']):>8}{fmt(full['p95_ms']):>8}",
            f"  turns ok {turns['ok']}/{results['arrivals']}, lost events "
            f"{turns['events_lost']}; the client started turns at most "
            f"{results['client_start_lag_max_ms']:.1f} ms late; sessions added to the pool "
            f"{results['sessions_added']}",
            *(f"  failure: {error}" for error in turns.get("first_errors", [])),
        ]
    )
