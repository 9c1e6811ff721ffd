"""(a) Time from POST to the first `delta` at the client, sequential turns, Parley beside the
baseline, interleaved turn by turn (bench/runner.py); and the untimed warm-up before it."""

from __future__ import annotations

from typing import Any

from bench.cpu import snapshot, usage
from bench.runner import Target, concurrent, sequential, timed
from bench.stack import Stack, log
from bench.throughput import fmt, ratio


async def warm_up(
    targets: list[Target], stack: Stack, *, turns: int, clients: int
) -> dict[str, Any]:
    """Imports, connection pools, the Temporal task queue: untimed turns, sequential then
    concurrent. A system with no successful warm-up turn is broken: say so now."""
    warm = await timed("warm-up (sequential)", sequential(targets, turns, turns, stack.check), log)
    for name, phase in warm.items():
        if not any(t.ok for t in phase.turns):
            raise RuntimeError(f"{name}: no warm-up turn succeeded: {phase.report()}")
    for target in targets:
        await timed(
            f"warm-up ({target.name}, concurrent)",
            concurrent(target, clients, 1, stack.check),
            log,
        )
    return {name: phase.report()["ok"] for name, phase in warm.items()}


async def measure_sequential(
    targets: list[Target], stack: Stack, *, turns: int, turns_per_session: int
) -> dict[str, Any]:
    log(f"(a) {turns} sequential turns per system, interleaved")
    before = snapshot()
    seq = await timed(
        "(a) sequential", sequential(targets, turns, turns_per_session, stack.check), log
    )
    cpu = usage(before, snapshot(), stack.roles())
    a = {name: phase.report() for name, phase in seq.items()}

    def over(measure: str, stat: str) -> float:
        return ratio(a["parley"][measure][stat], a["baseline"][measure][stat])

    return {
        **a,
        "cpu_both_interleaved": cpu,
        "turns_per_session": turns_per_session,
        "ratio_parley_over_baseline": {
            "first_delta_p50": over("first_delta", "p50_ms"),
            "first_delta_p95": over("first_delta", "p95_ms"),
            "full_turn_p50": over("full_turn", "p50_ms"),
        },
    }


def render_sequential(a: dict[str, Any]) -> str:
    lines = [
        "",
        f"(a) Time from POST to first `delta` at the client, sequential turns "
        f"(ms; fresh session every {a['turns_per_session']} turns)",
        f"{'':<22}{'turns ok':>9}{'first-delta p50':>17}{'p95':>9}"
        f"{'full-turn p50':>15}{'p95':>9}{'deltas/turn':>13}",
    ]
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
    for name in ("baseline", "parley"):
        for error in a[name].get("first_errors", []):
            lines.append(f"(a) {name} failure: {error}")
    return "\n".join(lines)
