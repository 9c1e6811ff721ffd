"""A run's result as data (the `--json` output and the HTML report's input), the terminal
table, the comparison of two runs and the verdict against a baseline. Pure."""

from __future__ import annotations

import math
from dataclasses import asdict
from decimal import Decimal
from typing import Any

from parley.eval.observe import StepSeen
from parley.eval.score import Scored, Tally

TURN_TYPES = ("no_tool", "tool", "confirmation")


def percentile(values: list[float], p: float) -> float | None:
    """Nearest-rank percentile; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


def _rate(part: int, whole: int) -> float | None:
    return round(part / whole, 4) if whole else None


def metrics(tally: Tally) -> dict[str, Any]:
    return {
        "context_consistency": _rate(tally.slot_turns_matched, tally.slot_turns),
        "clarification_recall": _rate(
            tally.clarifications_needed_asked, tally.clarifications_needed
        ),
        "over_asking_rate": _rate(tally.clarifications_unneeded, tally.clarifications_asked),
        "options_usable": _rate(tally.option_sets_usable, tally.option_sets),
        "tool_correctness": {
            "right_tool": _rate(tally.right_tool, tally.tool_expectations),
            "valid_arguments": _rate(tally.valid_arguments, tally.tool_expectations),
            "permitted": _rate(tally.permitted, tally.tool_expectations),
            "result_used": _rate(tally.result_used, tally.tool_expectations),
        },
        "counts": asdict(tally),
    }


def _turn(step: StepSeen) -> dict[str, Any]:
    return {
        "step": step.number,
        "kind": step.kind,
        "text": step.text,
        "type": step.turn_type,
        "turn_id": step.turn_id,
        "session_id": step.session_id,
        "ends_with": step.ends_with,
        "tools": [t.name for t in step.tools],
        "first_delta_s": _round(step.first_delta_s),
        "done_s": _round(step.end_s),
        "workflow_url": step.workflow_url,
        "reply": step.reply[:500],
        "slots": step.slots,
        "clarification": step.clarification,
        "trace": [
            {k: span.get(k) for k in ("name", "attempt", "outcome", "started_at", "ended_at")}
            for span in step.trace
        ],
    }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def latency(steps: list[StepSeen]) -> dict[str, Any]:
    """Time to the first `delta` and to the stream's end, p50 and p95, per turn type."""
    out: dict[str, Any] = {}
    for kind in TURN_TYPES:
        of_kind = [s for s in steps if s.turn_type == kind]
        first = [s.first_delta_s for s in of_kind if s.first_delta_s is not None]
        done = [s.end_s for s in of_kind if s.end_s is not None]
        out[kind] = {
            "turns": len(of_kind),
            "first_delta_p50_s": _round(percentile(first, 50)),
            "first_delta_p95_s": _round(percentile(first, 95)),
            "done_p50_s": _round(percentile(done, 50)),
            "done_p95_s": _round(percentile(done, 95)),
        }
    return out


def result(scored: list[Scored], *, label: str = "run") -> dict[str, Any]:
    """The whole run as JSON-ready data: every conversation and every metric of the suite."""
    total = Tally()
    conversations = []
    steps: list[StepSeen] = []
    for item in scored:
        total.add(item.tally)
        seen = item.seen
        steps += seen.steps if seen else []
        conversations.append(
            {
                "name": item.name,
                "path": item.path,
                "passed": item.passed,
                "failures": item.failures,
                "invariant_violations": item.violations,
                "metrics": metrics(item.tally),
                "tokens_in": seen.tokens_in if seen else None,
                "tokens_out": seen.tokens_out if seen else None,
                "cost_usd": seen.cost_usd if seen else None,
                "emails": len(seen.emails) if seen and seen.emails is not None else None,
                "turns": [_turn(s) for s in seen.steps] if seen else [],
            }
        )
    passed = sum(item.passed for item in scored)
    suite = {
        "conversations": len(scored),
        "passed": passed,
        "task_completion": _rate(passed, len(scored)),
        "invariant_violations": sum(len(item.violations) for item in scored),
        **metrics(total),
        "latency": latency(steps),
        "tokens_in": _sum(c["tokens_in"] for c in conversations),
        "tokens_out": _sum(c["tokens_out"] for c in conversations),
        "cost_usd": _money_sum(c["cost_usd"] for c in conversations),
    }
    return {"label": label, "suite": suite, "conversations": conversations}


def _sum(values: Any) -> int | None:
    present = [v for v in values if v is not None]
    return sum(present) if present else None


def _money_sum(values: Any) -> str | None:
    present = [Decimal(v) for v in values if v is not None]
    return str(sum(present, Decimal(0))) if present else None


def cost_differences(a: dict[str, Any], b: dict[str, Any]) -> list[dict[str, Any]]:
    """Per conversation in both runs, and for the whole suite: what run A's and run B's model
    calls cost (USD, from the ledger) and B's difference (shown, not judged: a dearer
    configuration is a choice)."""
    in_b = {c["name"]: c for c in b["conversations"]}
    rows = [
        (c["name"], c.get("cost_usd"), in_b[c["name"]].get("cost_usd"))
        for c in a["conversations"]
        if c["name"] in in_b
    ]
    rows.append(("suite", a["suite"].get("cost_usd"), b["suite"].get("cost_usd")))
    return [
        {
            "name": name,
            "a": left,
            "b": right,
            "difference": None
            if left is None or right is None
            else str(Decimal(right) - Decimal(left)),
        }
        for name, left, right in rows
    ]


def regressions(run: dict[str, Any], baseline: dict[str, Any]) -> list[str]:
    """Conversations that passed in the baseline and fail now (or vanished)."""
    now = {c["name"]: c for c in run["conversations"]}
    found = []
    for before in baseline["conversations"]:
        if not before["passed"]:
            continue
        current = now.get(before["name"])
        if current is None:
            found.append(f"{before['name']}: not in this run")
        elif not current["passed"]:
            first = (current["invariant_violations"] + current["failures"] or ["?"])[0]
            found.append(f"{before['name']}: passed before, fails now: {first}")
    return found


def differences(a: dict[str, Any], b: dict[str, Any]) -> list[dict[str, Any]]:
    """Per conversation: what differs between run A and run B in outcome and failures
    (latency and tokens are shown, not compared: they vary from run to run)."""
    in_b = {c["name"]: c for c in b["conversations"]}
    out = []
    for left in a["conversations"]:
        right = in_b.get(left["name"])
        if right is None:
            out.append({"name": left["name"], "a": _state(left), "b": "missing"})
            continue
        only_a = sorted(set(_problems(left)) - set(_problems(right)))
        only_b = sorted(set(_problems(right)) - set(_problems(left)))
        if left["passed"] != right["passed"] or only_a or only_b:
            out.append(
                {
                    "name": left["name"],
                    "a": _state(left),
                    "b": _state(right),
                    "only_in_a": only_a,
                    "only_in_b": only_b,
                }
            )
    return out


def _problems(conversation: dict[str, Any]) -> list[str]:
    return [*conversation["invariant_violations"], *conversation["failures"]]


def _state(conversation: dict[str, Any]) -> str:
    return "pass" if conversation["passed"] else "fail"


def table(run: dict[str, Any]) -> str:
    """The terminal table: one line per conversation, its first problem, then the suite."""
    rows = [("conversation", "result", "turns", "tokens in/out", "cost USD", "first problem")]
    for c in run["conversations"]:
        problems = _problems(c)
        tokens = "-" if c["tokens_in"] is None else f"{c['tokens_in']}/{c['tokens_out']}"
        cost = _usd(c.get("cost_usd"))
        verdict = "PASS" if c["passed"] else ("INVARIANT" if c["invariant_violations"] else "FAIL")
        first = problems[0] if problems else ""
        rows.append((c["name"], verdict, str(len(c["turns"])), tokens, cost, first))
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    lines = ["  ".join(r[i].ljust(widths[i]) for i in range(5)) + "  " + r[5] for r in rows]
    suite = run["suite"]
    lines.append("")
    lines.append(
        f"{suite['passed']}/{suite['conversations']} passed · task completion "
        f"{_pct(suite['task_completion'])} · context consistency "
        f"{_pct(suite['context_consistency'])}"
        f" · clarification recall {_pct(suite['clarification_recall'])} · over-asking "
        f"{_pct(suite['over_asking_rate'])} · invariant violations {suite['invariant_violations']}"
    )
    for kind, figures in suite["latency"].items():
        if figures["turns"]:
            lines.append(
                f"  {kind:<13} {figures['turns']:>3} turns  first delta p50 "
                f"{_ms(figures['first_delta_p50_s'])} p95 {_ms(figures['first_delta_p95_s'])}"
                f"  done p50 {_ms(figures['done_p50_s'])} p95 {_ms(figures['done_p95_s'])}"
            )
    return "\n".join(lines)


def _usd(value: str | None) -> str:
    """Whole cents and, below a cent, enough places to show something."""
    if value is None:
        return "-"
    amount = Decimal(value)
    return f"{amount:.2f}" if amount >= Decimal("0.01") or amount == 0 else f"{amount:.6f}"


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 100:.0f}%"


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 1000:.0f} ms"
