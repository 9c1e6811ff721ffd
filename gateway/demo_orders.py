"""The demo model's part for order searches (Dana's conversation of design.md).

It does what a careful model does with the server's help: the state block's `result_set`
says whether this message starts a search (the server already worked out the query, dates
included), narrows the last one, or refers to a stored set; the demo calls `search_orders`
with exactly that query, answers from the rows a tool or the state block returned, and
proposes a CSV export of the set referred to. It never computes a date or a filter itself.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import date
from typing import Any

_EXPORT = re.compile(r"\b(export|csv|spreadsheet|e-?mail|send)\b", re.IGNORECASE)
_STATUS = re.compile(r"\b(processing|shipped|delivered|cancell?ed)\b", re.IGNORECASE)
_NOT = re.compile(r"\b(not|hasn't|haven't|isn't|aren't|yet to)\b[^.?!]*$", re.IGNORECASE)


@dataclass(frozen=True)
class Step:
    """What the demo does next: answer with `text`, or call `tool` with `arguments`."""

    text: str = ""
    tool: str | None = None
    arguments: dict[str, Any] = field(default_factory=dict)


def next_step(state: dict[str, Any], user_text: str, results: dict[str, Any]) -> Step | None:
    """The demo's move when order searches are in play; None leaves the turn to the rest."""
    if "search_orders" in results:
        return Step(_about_search(results["search_orders"], _kind(state)))
    if "propose_orders_csv" in results:
        return Step(_about_export(results["propose_orders_csv"]))
    about = (state.get("resolution") or {}).get("result_set")
    if not about or results:
        return None
    if about["kind"] in ("new", "refine"):
        return Step(tool="search_orders", arguments=dict(about["query"]))
    if _EXPORT.search(user_text):
        return Step(tool="propose_orders_csv", arguments={"result_set_id": about["result_set_id"]})
    return Step(_about_referent(about, user_text))


def _kind(state: dict[str, Any]) -> str:
    return str(((state.get("resolution") or {}).get("result_set") or {}).get("kind", "new"))


def _day(value: str) -> str:
    d = date.fromisoformat(value)
    return f"{d:%b} {d.day}"


def _row(row: dict[str, Any]) -> str:
    return (
        f"{row['order_id']} ({_day(row['placed'])}, ${float(row['total']):,.2f}, {row['status']})"
    )


def _ids(rows: list[dict[str, Any]]) -> str:
    ids = [str(r["order_id"]) for r in rows]
    return ids[0] if len(ids) == 1 else ", ".join(ids[:-1]) + " and " + ids[-1]


def _about_search(result: dict[str, Any], kind: str) -> str:
    if "error" in result:
        if result["error"].get("code") == "unavailable":
            return "I couldn't reach the order system just now, so I can't search your orders."
        return "Something went wrong while I was searching your orders."
    rows, about = result.get("orders") or [], result.get("about", "orders")
    if not rows:
        return f"I found no {about}."
    noun = "order" if len(rows) == 1 else "orders"
    lead = "Of those, " if kind == "refine" else "I found "
    found = f"{len(rows)} {noun}" if kind != "refine" else f"{len(rows)} {noun} match"
    lines = "\n".join(f"- {_row(r)}" for r in rows)
    return f"{lead}{found} ({about}):\n{lines}"


def _about_export(result: dict[str, Any]) -> str:
    if "error" in result:
        return "I couldn't prepare that export: " + str(result["error"].get("message", "")) + "."
    rows = result["rows"]
    return (
        f"I've prepared an email with {result['filename']} attached ({rows} "
        f"row{'' if rows == 1 else 's'}: {', '.join(result['order_ids'])}) for your address on "
        f"file ({result['recipient_masked']}). Nothing is sent until you confirm."
    )


def _about_referent(about: dict[str, Any], user_text: str) -> str:
    rows: list[dict[str, Any]] = about.get("rows") or []
    asked = _STATUS.search(user_text)
    scope = f"Of those {len(rows)} orders ({_ids(rows)})" if rows else "Of those"
    if asked is None:
        listed = "; ".join(_row(r) for r in rows)
        return f"Those are the {about.get('about', 'orders')}: {listed}."
    word = asked.group(1).lower()
    negated = bool(_NOT.search(user_text[: asked.start()] + " "))
    if word == "shipped" and negated:
        # Not shipped yet: still being prepared (a cancelled order will never ship).
        match = [r for r in rows if r["status"] == "processing"]
        verb = "hasn't" if len(match) == 1 else "haven't"
        tail = f"{verb} shipped yet"
    else:
        wanted = "cancelled" if word.startswith("cancel") else word
        match = [r for r in rows if (r["status"] == wanted) != negated]
        tail = ("is not " if negated else "is ") + wanted
    if not match:
        return f"{scope}, none matches: " + "; ".join(_row(r) for r in rows) + "."
    details = ", ".join(f"{r['order_id']} is {r['status']}" for r in match)
    return f"{scope}, {_ids(match)} {tail}: {details}."
