"""(b) Throughput: Parley's plain and tool turns beside the baseline and the skeleton floor.

For each number of concurrent sessions, one table: the baseline (plain answer), Parley with a
plain answer, Parley with a tool turn, and the skeleton floors Temporal sets (bench/
skeleton.py): a workflow of one regular activity (the yardstick of issue 25), of as many
regular activities as each Parley turn, of as many local ones, and the new shape of a plain
turn (one workflow task, one local step storing one event), all measured in the same run on
the same servers. Each row carries the CPU every process spent per turn, its total over the
processes that do that row's work, and the events the client never saw.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from typing import Any

from temporalio.client import Client

from bench.cpu import snapshot, usage
from bench.runner import ParleyTarget, Phase, Target, concurrent, timed, tool_text, turn_text
from bench.shape import turn_shape
from bench.skeleton import Skeleton, floor, new_shape, no_op_steps, skeleton_turns
from bench.stack import Stack, log

# CPU per turn is reported for these processes, in this order.
CPU_ROLES = ("api", "worker", "temporal", "postgres", "baseline", "skeleton-worker")
# The processes whose CPU a row's total counts: those that do its work (an idle server's
# background polling is not the row's cost).
PARLEY_ROLES: tuple[str, ...] = ("api", "worker", "temporal", "postgres")
SKELETON_ROLES: tuple[str, ...] = ("temporal", "skeleton-worker")
ONE_ACTIVITY = "skeleton regular x1"
NEW_SHAPE = "skeleton new shape"


def ratio(a: float, b: float) -> float:
    return a / b if b and not math.isnan(a) and not math.isnan(b) else math.nan


def _with_cpu(phase: Phase, cpu: dict[str, Any], work_roles: tuple[str, ...]) -> dict[str, Any]:
    report = phase.report()
    ok = report["ok"]
    report["cpu"] = cpu
    report["cpu_ms_per_turn"] = {
        role: round(cpu.get(f"{role}_cpu_s", 0.0) * 1000 / ok, 1) if ok else math.nan
        for role in CPU_ROLES
        if cpu.get(f"{role}_cpu_s", 0.0) * 1000 / max(ok, 1) >= 0.5
    }
    spent = sum(cpu.get(f"{role}_cpu_s", 0.0) for role in work_roles)
    report["cpu_ms_per_turn_total"] = round(spent * 1000 / ok, 1) if ok else math.nan
    report["cpu_total_roles"] = list(work_roles)
    return report


async def _phase(
    label: str,
    stack: Stack,
    work: Callable[[], Any],
    rows: dict[str, Any],
    name: str,
    work_roles: tuple[str, ...],
) -> None:
    before = snapshot()
    phase = await timed(label, work(), log)
    rows[name] = _with_cpu(phase, usage(before, snapshot(), stack.roles()), work_roles)
    stack.check()


async def shapes(stack: Stack, parley: ParleyTarget) -> dict[str, dict[str, Any]]:
    """One plain and one tool turn, and what each cost Temporal (from its history)."""
    client = await Client.connect(stack.settings.temporal_address)
    out: dict[str, dict[str, Any]] = {}
    for kind, text in (("plain", turn_text), ("tool", tool_text)):
        await concurrent(parley, 1, 1, stack.check, text)
        if parley.last_turn_id is None:
            raise RuntimeError("no Parley turn to read the shape of")
        out[kind] = await turn_shape(client, parley.last_turn_id)
    return out


async def skeletons(
    stack: Stack, shape: dict[str, dict[str, Any]], clients: int
) -> dict[str, tuple[Skeleton, tuple[str, ...]]]:
    """The skeleton rows of one table, each with the processes its CPU total counts: one
    regular activity, as many regular activities as each Parley turn, as many local
    activities as the largest turn has steps, and the new shape (on turn rows of its own)."""
    regular = sorted({1} | {s["activities"] for s in shape.values() if s["activities"]})
    steps = max(s["activities"] + s["local_activities"] for s in shape.values())
    rows = {
        f"skeleton regular x{n}": (no_op_steps(n, local=False), SKELETON_ROLES) for n in regular
    }
    rows[f"skeleton local x{steps}"] = (no_op_steps(steps, local=True), SKELETON_ROLES)
    turn_ids = await skeleton_turns(stack.settings.database_url or "", clients)
    rows[NEW_SHAPE] = (new_shape(turn_ids), (*SKELETON_ROLES, "postgres"))
    return rows


async def throughput(
    stack: Stack,
    baseline: Target,
    parley: ParleyTarget,
    *,
    clients: int,
    total_turns: int,
    shape: dict[str, dict[str, Any]],
) -> dict[str, Any]:
    per_client = math.ceil(total_turns / clients)
    log(f"(b) {clients} concurrent clients x {per_client} turns per row")
    rows: dict[str, Any] = {}
    check = stack.check
    await _phase(
        f"(b{clients}) baseline",
        stack,
        lambda: concurrent(baseline, clients, per_client, check),
        rows,
        "baseline",
        ("baseline",),
    )
    for kind, text in (("plain", turn_text), ("tool", tool_text)):
        await _phase(
            f"(b{clients}) parley {kind}",
            stack,
            lambda text=text: concurrent(parley, clients, per_client, check, text),  # type: ignore[misc]
            rows,
            f"parley {kind}",
            PARLEY_ROLES,
        )
    address, queue = stack.settings.temporal_address, stack.skeleton_queue
    for name, (skeleton, roles) in (await skeletons(stack, shape, clients)).items():
        await _phase(
            f"(b{clients}) {name}",
            stack,
            lambda skeleton=skeleton: floor(  # type: ignore[misc]
                address, queue, skeleton, clients=clients, per_client=per_client
            ),
            rows,
            name,
            roles,
        )
    return {
        "clients": clients,
        "turns_per_client": per_client,
        "rows": rows,
        "ratios": {kind: _ratios(rows, kind, shape[kind]) for kind in ("plain", "tool")},
    }


def _ratios(rows: dict[str, Any], kind: str, shape: dict[str, Any]) -> dict[str, float]:
    """A Parley row against the baseline and the skeleton floors of the same table."""
    r = rows[f"parley {kind}"]
    same = rows.get(f"skeleton regular x{shape['activities']}", {})

    def rate_over(row: dict[str, Any]) -> float:
        return ratio(r["turns_per_s"], row.get("turns_per_s", math.nan))

    return {
        "turns_per_s_over_baseline": rate_over(rows["baseline"]),
        "turns_per_s_over_skeleton_regular": rate_over(same),
        "turns_per_s_over_one_activity_skeleton": rate_over(rows[ONE_ACTIVITY]),
        "turns_per_s_over_new_shape_skeleton": rate_over(rows[NEW_SHAPE]),
        "cpu_over_one_activity_skeleton": ratio(
            r["cpu_ms_per_turn_total"], rows[ONE_ACTIVITY]["cpu_ms_per_turn_total"]
        ),
        "first_delta_p50_over_baseline": ratio(
            r["first_delta"]["p50_ms"], rows["baseline"]["first_delta"]["p50_ms"]
        ),
    }


def fmt(value: float | None, digits: int = 1) -> str:
    return "n/a" if value is None or math.isnan(value) else f"{value:.{digits}f}"


def render_throughput(result: dict[str, Any], shape: dict[str, dict[str, Any]]) -> list[str]:
    rows = result["rows"]
    lines = [
        f"(b) Throughput, {result['clients']} concurrent sessions x "
        f"{result['turns_per_client']} turns back to back (latencies in ms; CPU in ms per turn)",
        f"{'':<22}{'ok':>8}{'turns/s':>9}{'x base':>8}{'full p50':>10}{'p95':>8}"
        f"{'1st-delta p50':>14}{'p95':>8}{'lost':>6}{'CPU':>6}  CPU ms/turn by process",
    ]
    base = rows["baseline"]["turns_per_s"]
    for name, r in rows.items():
        first = r["first_delta"] if not name.startswith("skeleton") else None
        cpu = ", ".join(f"{role} {ms:.0f}" for role, ms in r["cpu_ms_per_turn"].items())
        lines.append(
            f"{name:<22}{r['ok']:>4}/{r['turns']:<3}{fmt(r['turns_per_s'], 2):>9}"
            f"{fmt(ratio(r['turns_per_s'], base), 3):>8}"
            f"{fmt(r['full_turn']['p50_ms']):>10}{fmt(r['full_turn']['p95_ms']):>8}"
            f"{fmt(first['p50_ms'] if first else None):>14}"
            f"{fmt(first['p95_ms'] if first else None):>8}"
            f"{r['events_lost'] if first else '':>6}{fmt(r['cpu_ms_per_turn_total'], 0):>6}  {cpu}"
        )
    for kind, r in result["ratios"].items():
        s = shape[kind]
        lines.append(
            f"parley {kind}: {s['activities']} activities, {s['local_activities']} local, "
            f"{s['workflow_tasks']} workflow tasks, {s['upserts']} search-attribute upserts; "
            f"turns/s = {fmt(r['turns_per_s_over_baseline'], 3)}x baseline, "
            f"{_percent(r['turns_per_s_over_one_activity_skeleton'])} of the one-activity "
            f"skeleton, {_percent(r['turns_per_s_over_new_shape_skeleton'])} of the new-shape "
            f"skeleton, {_percent(r['turns_per_s_over_skeleton_regular'])} of the skeleton with "
            f"as many regular activities; CPU per turn "
            f"{fmt(r['cpu_over_one_activity_skeleton'], 1)}x the one-activity skeleton's"
        )
    for name, r in rows.items():
        for error in r.get("first_errors", []):
            lines.append(f"  {name} failure: {error}")
    return lines


def _percent(value: float) -> str:
    return f"{fmt(value * 100, 0)}%"


def render_concurrent(tables: dict[str, Any], shape: dict[str, dict[str, Any]]) -> str:
    """Every table of (b), and what their columns mean."""
    lines: list[str] = [""]
    for table in tables.values():
        lines.extend(render_throughput(table, shape))
        lines.append("")
    lines.append(
        f"{os.cpu_count()} cores; 'x base' = turns/s over the baseline's in the same table; "
        "the skeleton rows are Temporal's floor for a workflow of that many no-op activities "
        "(the new shape: one workflow task, one local step storing one event); 'CPU' = ms per "
        "turn of the processes doing the row's work (Parley: API, worker, Temporal, "
        "PostgreSQL; skeleton: Temporal and its worker, plus PostgreSQL for the new shape); "
        "'lost' = event ids the client never received plus answers whose done text differs "
        "from their deltas"
    )
    for table in tables.values():
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
    return "\n".join(lines)
