"""(l) Open-loop load (issue 25, acceptance 4): plain turns arriving at half the plain-turn
capacity measured in (b) of the same run, for `--open-loop-s` seconds, and the first `delta`
under that load beside the unloaded p50 of (a).

The throughput tables are closed loops: each session waits for its answer before the next
message, so a slower system is simply sent less and never sees a queue build. Here turns
arrive on a fixed schedule whatever the system does, as users arrive: a Poisson process
(exponential gaps, drawn from a fixed seed, so every run sends the same schedule). Each turn
takes a session no turn is running in (a session runs one turn at a time) from a pool made
before the clock; when every session is busy, a new one joins the pool. A session runs as many
turns as a session of (a) does (`--turns-per-session`), then a fresh one takes its place: the
unloaded p50 this is read against was measured on sessions that young, and an older session
costs more per turn (from about its ninth turn the window no longer holds the conversation and
recall runs), so a pool reused for the whole minute (about eleven turns a session) measured
deeper sessions under load than unloaded. The client's lag behind the schedule is reported,
so a client that could not keep up is seen, not hidden.

Beside Parley, the same kind of load on two floors, each at half its own capacity in the same
table of (b) and read against its own unloaded p50: the bare stream of the baseline (its
first `delta`) and the new-shape skeleton (start, one workflow task, one local step storing
one event, to its end). Queueing alone stretches a tail under Poisson arrivals; the floors
show how much of the ratio any system on this machine pays at half its capacity.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from temporalio.client import Client

from bench.runner import ParleyTarget, Phase, Target, Turn, run_turn, turn_text
from bench.skeleton import run_skeleton, skeleton_turns
from bench.stack import Stack, log
from bench.throughput import NEW_SHAPE, fmt, ratio

SEED = 25  # the number: one fixed schedule for every run
POOL_SECONDS = 5.0  # sessions made before the clock: enough for this many seconds of arrivals
POOL_BATCH = 8  # sessions made at once, before the clock
FLOOR_SHARE = 0.5  # each floor's open loop runs this share of Parley's duration
FLOOR_UNLOADED_RUNS = 20  # the new-shape skeleton's unloaded p50: this many runs, one at a time


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


def floor_capacities(tables: dict[str, Any], capacity: tuple[float, str]) -> dict[str, float]:
    """The floors' rates (turns or workflows per second) in the table Parley's capacity came
    from: the bare stream's and the new-shape skeleton's."""
    rows = next(t["rows"] for c, t in tables.items() if f"{c} concurrent sessions" == capacity[1])
    return {"baseline": rows["baseline"]["turns_per_s"], NEW_SHAPE: rows[NEW_SHAPE]["turns_per_s"]}


@dataclass(frozen=True)
class Load:
    """What one open loop drives: a key per running turn (a session, a turn row), how to
    make `n` more (before the clock, and one when all are busy), and how to run one turn on
    a key."""

    new_keys: Callable[[int], Awaitable[list[str]]]
    run: Callable[[str, int], Awaitable[Turn]]
    turns_per_key: int | None = None  # then a fresh key takes its place (None: no limit)


def target_load(target: Target, turns_per_session: int | None = None) -> Load:
    async def conversations(n: int) -> list[str]:
        # A few at a time: fifty POSTs at once outgrow the stack's connections (the API's
        # pool overflows while the worker holds its own) and PostgreSQL refuses the rest.
        made: list[str] = []
        while len(made) < n:
            batch = min(POOL_BATCH, n - len(made))
            made += await asyncio.gather(*(target.new_conversation() for _ in range(batch)))
        return made

    async def run(conversation: str, i: int) -> Turn:
        return await run_turn(target, conversation, turn_text(i))

    return Load(conversations, run, turns_per_session)


async def measure_open_loop(
    parley: ParleyTarget,
    stack: Stack,
    *,
    capacity: tuple[float, str],
    unloaded_p50_ms: float,
    duration_s: float,
    turns_per_session: int,
) -> dict[str, Any]:
    rate = capacity[0] / 2
    log(f"(l) open loop: plain turns at {rate:.2f}/s for {duration_s:g} s")
    stack.check()
    load = target_load(parley, turns_per_session)
    phase, lags, added = await open_loop(load, rate, duration_s)
    stack.check()
    report = phase.report()
    first = report["first_delta"]
    return {
        "capacity_turns_per_s": capacity[0],
        "capacity_from": capacity[1],
        "rate_per_s": rate,
        "duration_s": duration_s,
        "arrivals": len(lags),
        "turns": report,
        "unloaded_first_delta_p50_ms": unloaded_p50_ms,
        "first_delta_p50_over_unloaded_p50": ratio(first["p50_ms"], unloaded_p50_ms),
        "first_delta_p95_over_unloaded_p50": ratio(first["p95_ms"], unloaded_p50_ms),
        "client_start_lag_max_ms": max(lags, default=0.0) * 1000,
        "sessions_added": added,
        "turns_per_session": turns_per_session,
    }


async def measure_floors(
    baseline: Target,
    stack: Stack,
    capacities: dict[str, float],
    *,
    baseline_unloaded_p50_ms: float,
    duration_s: float,
) -> dict[str, Any]:
    """The same load on the bare stream and on the new-shape skeleton, each at half its own
    capacity, each read against its own unloaded p50."""
    client = await Client.connect(stack.settings.temporal_address)
    database_url = stack.settings.database_url or ""
    run_id = uuid.uuid4().hex[:8]

    async def turn_rows(n: int) -> list[str]:
        return await skeleton_turns(database_url, n)

    async def skeleton(turn_id: str, i: int) -> Turn:
        wid = f"skeleton-open-{run_id}-{i}"
        return await run_skeleton(client, stack.skeleton_queue, "SkeletonNewShape", turn_id, wid)

    row = (await turn_rows(1))[0]
    unloaded = Phase()
    for i in range(FLOOR_UNLOADED_RUNS):
        unloaded.turns.append(await skeleton(row, -1 - i))
    loads = {
        "baseline": (target_load(baseline), baseline_unloaded_p50_ms),
        NEW_SHAPE: (Load(turn_rows, skeleton), unloaded.report()["first_delta"]["p50_ms"]),
    }
    out: dict[str, Any] = {}
    for name, (load, unloaded_ms) in loads.items():
        rate = capacities[name] / 2
        log(f"(l) open loop on the floor {name!r}: {rate:.2f}/s for {duration_s:g} s")
        stack.check()
        phase, lags, _ = await open_loop(load, rate, duration_s)
        stack.check()
        report = phase.report()
        out[name] = {
            "rate_per_s": rate,
            "duration_s": duration_s,
            "turns": report,
            "unloaded_p50_ms": unloaded_ms,
            "p95_over_unloaded_p50": ratio(report["first_delta"]["p95_ms"], unloaded_ms),
            "client_start_lag_max_ms": max(lags, default=0.0) * 1000,
        }
    return out


async def open_loop(load: Load, rate: float, duration_s: float) -> tuple[Phase, list[float], int]:
    """Turns arriving on the fixed Poisson schedule at `rate` for `duration_s`, each on a key
    no turn is running on (keys made before the clock, more when all are busy)."""
    arrivals = arrival_times(rate, duration_s, random.Random(SEED))
    keys: asyncio.Queue[str] = asyncio.Queue()
    for key in await load.new_keys(math.ceil(rate * POOL_SECONDS) + 2):
        keys.put_nowait(key)
    return await _arrive(load, keys, arrivals)


async def _arrive(
    load: Load, keys: asyncio.Queue[str], arrivals: list[float]
) -> tuple[Phase, list[float], int]:
    """Start each turn at its time without waiting for earlier ones; return the turns, how
    late the client started each, and how many keys had to join the pool."""
    phase, lags, added = Phase(), [], 0
    uses: dict[str, int] = {}

    async def turn(i: int) -> None:
        nonlocal added
        if keys.empty():
            added += 1
            keys.put_nowait((await load.new_keys(1))[0])
        key = keys.get_nowait()
        phase.turns.append(await load.run(key, i))
        uses[key] = uses.get(key, 0) + 1
        if load.turns_per_key is not None and uses[key] >= load.turns_per_key:
            key = (await load.new_keys(1))[0]  # made after the turn, off the schedule
        keys.put_nowait(key)

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
            f"{results['sessions_added']}; a fresh session every "
            f"{results.get('turns_per_session', 'n/a')} turns, as in (a)",
            *(f"  failure: {error}" for error in turns.get("first_errors", [])),
        ]
    )


def render_floors(floors: dict[str, Any]) -> str:
    lines = [
        "",
        "(l) The floors under the same kind of load: each at half its own capacity in the table",
        "  of (b) that Parley's came from, against its own unloaded p50 (the bare stream: its",
        "  first delta, unloaded from (a); the new-shape skeleton: start to end, one at a time)",
        f"  {'':<26}{'rate/s':>8}{'p50':>8}{'p95':>8}{'unloaded':>10}{'p95 x':>8}",
    ]
    for name, f in floors.items():
        first = f["turns"]["first_delta"]
        lines.append(
            f"  {name:<26}{fmt(f['rate_per_s'], 2):>8}{fmt(first['p50_ms']):>8}"
            f"{fmt(first['p95_ms']):>8}{fmt(f['unloaded_p50_ms']):>10}"
            f"{fmt(f['p95_over_unloaded_p50'], 2) + 'x':>8}"
        )
        lines += [f"  failure ({name}): {e}" for e in f["turns"].get("first_errors", [])]
    return "\n".join(lines)
