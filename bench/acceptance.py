"""Issue 45's acceptance figures, gathered from one run's results into one block a closing
note can paste: each figure, its ratio against the floor it is read against (the bare
stream, Temporal's skeletons, the stream-scale baseline commit, all measured in the same
run), and the target. Points 6 and 7 are tests, not figures.

Only figures are read here, nothing is measured; a figure whose section failed or was skipped
says so instead of taking the block down. "met" and "not met" read one run's figures, on
whatever load the machine had: they are not a verdict.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from bench.sections import failed, failures
from bench.throughput import NEW_SHAPE, ONE_ACTIVITY, PARLEY_ROLES, fmt, ratio
from bench.timeline import STAGES

TABLE = "20"  # acceptance 2 and 3 read the table with 20 concurrent sessions
OPEN_LOOP_FLOOR = "skeleton new shape"  # acceptance 4's floor


def _verdict(ok: bool) -> str:
    return "met" if ok else "NOT met"


def _at_most(value: float, target: float) -> str:
    return "n/a" if math.isnan(value) else _verdict(value <= target)


def _at_least(value: float, target: float) -> str:
    return "n/a" if math.isnan(value) else _verdict(value >= target)


def _table(results: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The (b) table acceptance 2 and 3 read: 20 sessions, else the first one measured."""
    tables = results["concurrent"]
    clients = TABLE if TABLE in tables else next(iter(tables))
    return clients, tables[clients]


def first_delta(results: dict[str, Any]) -> list[str]:
    a = results["sequential"]
    parley, base = a["parley"]["first_delta"], a["baseline"]["first_delta"]
    ratios = a["ratio_parley_over_baseline"]
    lines = [
        f"1 first delta p50 {fmt(parley['p50_ms'])} ms / baseline {fmt(base['p50_ms'])} ms = "
        f"{fmt(ratios['first_delta_p50'], 2)}x (target <= 3x): "
        f"{_at_most(ratios['first_delta_p50'], 3)}",
        f"  first delta p95 {fmt(parley['p95_ms'])} ms / baseline {fmt(base['p95_ms'])} ms = "
        f"{fmt(ratios['first_delta_p95'], 2)}x (target <= 3.5x): "
        f"{_at_most(ratios['first_delta_p95'], 3.5)}",
    ]
    timeline = results.get("timeline", {})
    stages = timeline.get("stages_p50_ms")
    if stages:
        where = ", ".join(f"{stage.removeprefix('-> ')} {ms:.1f}" for stage, ms in stages.items())
        lines.append(f"  where it goes, p50 ms per stage (h): {where}")
    floor = timeline.get("eager_local_first_step_p50_ms")
    if stages and floor is not None:
        to_step = sum(list(stages.values())[: STAGES.index("-> first step running") + 1])
        lines.append(
            f"  POST -> first step running {to_step:.1f} ms; Temporal's floor for a turn's shape "
            f"(eager start -> first local step) {floor:.1f} ms"
        )
    return lines


def throughput(results: dict[str, Any]) -> list[str]:
    clients, table = _table(results)
    rows, ratios = table["rows"], table["ratios"]
    plain, tool = ratios["plain"], ratios["tool"]
    lost = sum(r["events_lost"] for name, r in rows.items() if name.startswith("parley"))
    return [
        f"2 plain turns/s ({clients} sessions) {fmt(rows['parley plain']['turns_per_s'], 2)} = "
        f"{fmt(plain['turns_per_s_over_one_activity_skeleton'] * 100, 0)}% of the one-activity "
        f"skeleton's {fmt(rows[ONE_ACTIVITY]['turns_per_s'], 2)} (target >= 65%): "
        f"{_at_least(plain['turns_per_s_over_one_activity_skeleton'], 0.65)}; "
        f"{fmt(plain['turns_per_s_over_new_shape_skeleton'] * 100, 0)}% of the new-shape "
        f"skeleton's {fmt(rows[NEW_SHAPE]['turns_per_s'], 2)}",
        f"  tool turns/s {fmt(rows['parley tool']['turns_per_s'], 2)} = "
        f"{fmt(tool['turns_per_s_over_one_activity_skeleton'] * 100, 0)}% of the one-activity "
        f"skeleton's (target >= 40%): "
        f"{_at_least(tool['turns_per_s_over_one_activity_skeleton'], 0.4)}",
        f"  lost events in the Parley rows of that table: {lost} (target 0): {_verdict(lost == 0)}",
    ]


def cpu(results: dict[str, Any]) -> list[str]:
    clients, table = _table(results)
    plain, skeleton = table["rows"]["parley plain"], table["rows"][ONE_ACTIVITY]
    by_process = ", ".join(
        f"{role} {plain['cpu_ms_per_turn'].get(role, 0.0):.0f}" for role in PARLEY_ROLES
    )
    over = table["ratios"]["plain"]["cpu_over_one_activity_skeleton"]
    return [
        f"3 CPU per plain turn ({clients} sessions) {fmt(plain['cpu_ms_per_turn_total'], 0)} ms "
        f"({by_process}) = {fmt(over, 2)}x the one-activity skeleton's "
        f"{fmt(skeleton['cpu_ms_per_turn_total'], 0)} ms (target <= 1.7x): {_at_most(over, 1.7)}"
    ]


def open_loop(results: dict[str, Any]) -> list[str]:
    o = results["open_loop"]
    over = o["first_delta_p95_over_unloaded_p50"]
    floor = results["open_loop_floors"][OPEN_LOOP_FLOOR]["p95_over_unloaded_p50"]
    over_floor = ratio(over, floor)
    return [
        f"4 open loop at {o['rate_per_s']:.2f} turns/s for {o['duration_s']:g} s (half the "
        f"plain capacity): first delta p95 {fmt(o['turns']['first_delta']['p95_ms'])} ms = "
        f"{fmt(over, 2)}x the unloaded p50 {fmt(o['unloaded_first_delta_p50_ms'])} ms; the "
        f"{OPEN_LOOP_FLOOR}'s p95 at half its capacity {fmt(floor, 2)}x its unloaded "
        f"p50; {fmt(over, 2)} / {fmt(floor, 2)} = {fmt(over_floor, 2)} (target <= 1.3): "
        f"{_at_most(over_floor, 1.3)}"
    ]


def stream_ceiling(results: dict[str, Any]) -> list[str]:
    u = results["stream_scale"]
    base, current = u["baseline"]["ceiling"], u["current"]["ceiling"]
    times = ratio(current, base)
    below = [step for step in u["current"]["steps"] if step["n"] <= current]
    wrong = sum(step["lost"] + step["duplicated"] for step in below)
    return [
        f"5 concurrent-stream ceiling {current} / the starting commit's ({u['baseline_commit']}) "
        f"{base} = {fmt(times, 2)}x (target >= 4x): {_at_least(times, 4)}",
        f"  lost or duplicated events at the {len(below)} steps up to it: {wrong} (target 0): "
        f"{_verdict(wrong == 0)}",
    ]


CHECKS: dict[str, tuple[tuple[str, ...], Callable[[dict[str, Any]], list[str]]]] = {
    "1": (("sequential",), first_delta),
    "2": (("concurrent",), throughput),
    "3": (("concurrent",), cpu),
    "4": (("open_loop", "open_loop_floors"), open_loop),
    "5": (("stream_scale",), stream_ceiling),
}


def render_acceptance(results: dict[str, Any]) -> str:
    broken = failures(results)
    lines = [
        "",
        "Acceptance (issue 45): this run's figures, ratios against this run's floors",
        f"0 sections that failed: {', '.join(broken) if broken else 'none'}",
    ]
    for number, (needs, check) in CHECKS.items():
        missing = [name for name in needs if name not in results or failed(results[name])]
        if missing:
            lines.append(f"{number} not measured: {', '.join(missing)} failed or skipped")
            continue
        try:
            lines.extend(check(results))
        except (KeyError, StopIteration) as exc:
            lines.append(f"{number} not measured: figure {exc} missing")
    return "\n".join(lines)
