"""The demo model's part for skills (the `run_skill` tool, parley/skills.py).

"Make me a chart of my October spending by week." asks for `spending_chart` with the month
as the user named it (the server works out which October and fetches the orders itself); the
answer names the chart and reads out the weekly totals the skill reported. "Run the <name>
skill." asks for any offered skill by name, with no arguments. When the skill could not run
the answer says so, never that a chart exists; with no sandbox at all it answers without the
skill, from a plain search of the same month.
"""

from __future__ import annotations

import calendar
import json
import re
from datetime import date
from decimal import Decimal
from typing import Any

from parley.gateway.demo_orders import Step
from parley.skills import RUN_SKILL, SANDBOX_UNAVAILABLE, SKILL_TIMED_OUT

_MONTH_NAMES = "|".join(name for name in calendar.month_name if name)
_CHART = re.compile(
    rf"\b(chart|graph|plot)\b.*?\b({_MONTH_NAMES})\b|\b({_MONTH_NAMES})\b.*?\b(chart|graph|plot)\b",
    re.IGNORECASE,
)
_NAMED = re.compile(r"\brun the ([a-z][a-z0-9_]*) skill\b", re.IGNORECASE)
CHART_SKILL = "spending_chart"


def next_step(tools: list[dict[str, Any]], user_text: str, results: dict[str, Any]) -> Step | None:
    """The demo's move when a skill is in play; None leaves the turn to the rest."""
    if RUN_SKILL in results:
        return _after(results[RUN_SKILL], results.get("search_orders"))
    if results:
        return None
    offered = _offered_skills(tools)
    named = _NAMED.search(user_text)
    if named is not None and named.group(1) in offered:
        return Step(tool=RUN_SKILL, arguments={"skill": named.group(1), "arguments": {}})
    chart = _CHART.search(user_text)
    if chart is None:
        return None
    if CHART_SKILL not in offered:
        return Step("I can't make charts here, but I can list your orders for that month.")
    month = (chart.group(2) or chart.group(3)).capitalize()
    return Step(tool=RUN_SKILL, arguments={"skill": CHART_SKILL, "arguments": {"month": month}})


def _offered_skills(tools: list[dict[str, Any]]) -> list[str]:
    for tool in tools:
        if tool.get("name") == RUN_SKILL:
            skill = tool.get("parameters", {}).get("properties", {}).get("skill", {})
            return [str(name) for name in skill.get("enum", [])]
    return []


def _after(result: dict[str, Any], search: dict[str, Any] | None) -> Step:
    error = result.get("error")
    if isinstance(error, dict):
        code = error.get("code")
        if code == SANDBOX_UNAVAILABLE:
            period = result.get("period")
            if search is None and isinstance(period, dict):
                return Step(tool="search_orders", arguments=dict(period))
            return Step(_without_skill(search))
        if code == SKILL_TIMED_OUT:
            return Step("The skill ran past its time limit and was stopped, so I have no result.")
        return Step("The skill didn't finish, so I have no result to show you.")
    artifacts = result.get("artifacts") or []
    if not artifacts:
        return Step("The skill finished but produced no file.")
    names = ", ".join(str(a["name"]) for a in artifacts)
    weeks = _weeks_from_summary(str(result.get("summary") or ""))
    lines = "; ".join(f"week {w[-2:]}: ${t:,.2f}" for w, t in weeks)
    text = f"Here is your chart of spending by week ({names})."
    return Step(f"{text} {lines}." if lines else text)


def _weeks_from_summary(summary: str) -> list[tuple[str, Decimal]]:
    try:
        weeks = json.loads(summary).get("weeks") or []
        return [(str(w["week"]), Decimal(str(w["total"]))) for w in weeks]
    except (ValueError, AttributeError, KeyError, TypeError):
        return []


def _without_skill(search: dict[str, Any] | None) -> str:
    """No sandbox: the weekly totals in words, from the plain search."""
    text = "I can't make charts right now (skills need a sandbox, and none is available here)"
    rows = (search or {}).get("orders")
    if not rows:
        return text + "."
    totals: dict[int, Decimal] = {}
    for row in rows:
        if row.get("status") != "cancelled":
            week = date.fromisoformat(str(row["placed"])).isocalendar()[1]
            totals[week] = totals.get(week, Decimal(0)) + Decimal(str(row["total"]))
    lines = "; ".join(f"week {week}: ${total:,.2f}" for week, total in sorted(totals.items()))
    return f"{text}, so here is your spending by week in words: {lines}."
