"""(b) Throughput: Parley's plain and tool turns beside the baseline and the skeleton floor.

For each number of concurrent sessions, one table: the baseline (plain answer), Parley with a
plain answer, Parley with a tool turn, and the skeleton floor Temporal sets for a workflow of
the same number of regular activities as each Parley turn (and of local ones), all measured in
the same run on the same servers. Each row carries the CPU every process spent per turn and
the events the client never saw.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from temporalio.client import Client

from bench.cpu import snapshot, usage
from bench.runner import ParleyTarget, Phase, Target, concurrent, timed, tool_text, turn_text
from bench.shape import turn_shape
from bench.skeleton import floor
from bench.stack import Stack, log

# CPU per turn is reported for these processes, in this order.
CPU_ROLES = ("api", "worker", "temporal", "postgres", "baseline", "skeleton-worker")


def ratio(a: float, b: float) -> float:
    return a / b if b and not math.isnan(a) and not math.isnan(b) else math.nan


def _with_cpu(phase: Phase, cpu: dict[str, Any]) -> dict[str, Any]:
    report = phase.report()
    ok = report["ok"]
    report["cpu"] = cpu
    report["cpu_ms_per_turn"] = {
        role: round(cpu.get(f"{role}_cpu_s", 0.0) * 1000 / ok, 1) if ok else math.nan
        for role in CPU_ROLES
        if cpu.get(f"{role}_cpu_s", 0.0) * 1000 / max(ok, 1) >= 0.5
    }
    return report


async def _phase(
    label: str, stack: Stack, work: Callable[[], Any], rows: dict[str, Any], name: str
) -> None:
    before = snapshot()
    phase = await timed(label, work(), log)
    rows[name] = _with_cpu(phase, usage(before, snapshot(), stack.roles()))
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
    )
    for kind, text in (("plain", turn_text), ("tool", tool_text)):
        await _phase(
            f"(b{clients}) parley {kind}",
            stack,
            lambda text=text: concurrent(parley, clients, per_client, check, text),  # type: ignore[misc]
            rows,
            f"parley {kind}",
        )
    address, queue = stack.settings.temporal_address, stack.skeleton_queue
    floors = sorted({shape[k]["activities"] for k in shape}) + [
        -max(s["activities"] + s["local_activities"] for s in shape.values())
    ]
    for steps in floors:  # a negative count: that many local activities
        name = f"skeleton {'local' if steps < 0 else 'regular'} x{abs(steps)}"
        await _phase(
            f"(b{clients}) {name}",
            stack,
            lambda steps=steps: floor(  # type: ignore[misc]
                address,
                queue,
                clients=clients,
                per_client=per_client,
                steps=abs(steps),
                local=steps < 0,
            ),
            rows,
            name,
        )
    base = rows["baseline"]["turns_per_s"]
    ratios: dict[str, Any] = {}
    for kind in ("plain", "tool"):
        r = rows[f"parley {kind}"]
        skeleton = rows[f"skeleton regular x{shape[kind]['activities']}"]
        ratios[kind] = {
            "turns_per_s_over_baseline": ratio(r["turns_per_s"], base),
            "turns_per_s_over_skeleton_regular": ratio(r["turns_per_s"], skeleton["turns_per_s"]),
            "first_delta_p50_over_baseline": ratio(
                r["first_delta"]["p50_ms"], rows["baseline"]["first_delta"]["p50_ms"]
            ),
        }
    return {"clients": clients, "turns_per_client": per_client, "rows": rows, "ratios": ratios}


def fmt(value: float | None, digits: int = 1) -> str:
    return "n/a" if value is None or math.isnan(value) else f"{value:.{digits}f}"


def render_throughput(result: dict[str, Any], shape: dict[str, dict[str, Any]]) -> list[str]:
    rows = result["rows"]
    lines = [
        f"(b) Throughput, {result['clients']} concurrent sessions x "
        f"{result['turns_per_client']} turns back to back (latencies in ms; CPU in ms per turn)",
        f"{'':<22}{'ok':>8}{'turns/s':>9}{'x base':>8}{'full p50':>10}{'p95':>8}"
        f"{'1st-delta p50':>14}{'p95':>8}{'lost':>6}  CPU ms/turn by process",
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
            f"{r['events_lost'] if first else '':>6}  {cpu}"
        )
    for kind, r in result["ratios"].items():
        s = shape[kind]
        lines.append(
            f"parley {kind}: {s['activities']} activities, {s['local_activities']} local, "
            f"{s['workflow_tasks']} workflow tasks, {s['upserts']} search-attribute upserts; "
            f"turns/s = {fmt(r['turns_per_s_over_baseline'], 3)}x baseline, "
            f"{fmt(r['turns_per_s_over_skeleton_regular'] * 100, 0)}% of the skeleton floor "
            f"with as many regular activities"
        )
    for name, r in rows.items():
        for error in r.get("first_errors", []):
            lines.append(f"  {name} failure: {error}")
    return lines
