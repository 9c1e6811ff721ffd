"""Result sets as referents: which search does the user mean, in code, never left to the model.

A `search_orders` result is stored as a result set (its query and its ordered order ids). A
later message is read against the stored sets by a fixed ladder:

1. an answer to the question we asked last turn about which set ("the first one", or an
   option's text) picks that set;
2. a date phrase ("last week", "in October", "this month") starts a **new scope**: a fresh
   query from the message alone, never a subset of the last one;
3. a narrowing constraint ("just the ones over $500", "only the shipped ones") **refines** the
   latest set: its query plus the new constraint;
4. "those", "them", "these" **refer** to the latest set as it is;
5. when the latest turn left two or more sets, a refinement or a reference is ambiguous:
   **ask** one question with the sets as options.

Dates are relative to the backend's "today" (the demo clock): "last week" is the previous
Monday to Sunday. "Over" is strictly greater. Pure functions over plain data.
"""

from __future__ import annotations

import calendar
import csv
import io
import re
from dataclasses import dataclass, field
from datetime import date, timedelta
from decimal import Decimal
from typing import Any, Literal

from parley.resolver import Clarification, Option

# The option type a result-set clarification carries (the order resolver ignores it).
RESULT_SET = "result_set"
CSV_FILENAME = "orders.csv"
CSV_COLUMNS = ("order_id", "placed", "total", "status")
ORDER_STATUSES = ("processing", "shipped", "delivered", "cancelled")

_MONTHS = {name.lower(): i for i, name in enumerate(calendar.month_name) if name}
_MONTHS |= {name.lower(): i for i, name in enumerate(calendar.month_abbr) if name}
# A month counts only after a preposition: "in October", never the verb "may".
_MONTH = re.compile(
    r"\b(?:in|during|for|from|since|of)\s+(" + "|".join(_MONTHS) + r")\b", re.IGNORECASE
)
_RELATIVE = re.compile(r"\b(last|this|past)\s+(week|month)\b|\b(yesterday)\b", re.I)
_OVER = re.compile(
    r"\b(?:over|above|more than|greater than|exceeding)\s*(?:usd\s*)?\$?\s*"
    r"(\d{1,3}(?:,\d{3})+|\d+)(\.\d{1,2})?",
    re.IGNORECASE,
)
_STATUS = re.compile(r"\b(processing|shipped|delivered|cancell?ed)\b", re.IGNORECASE)
_NEGATED = re.compile(r"\b(not|never|hasn't|haven't|isn't|aren't|wasn't|weren't|yet to)\s+\w*\s*$")
_ANAPHOR = re.compile(r"\b(those|them|these|the same ones)\b", re.IGNORECASE)
_NARROW = re.compile(r"\b(just|only|the ones|of those|of them|among them|which of)\b", re.I)
_SEARCHY = re.compile(
    r"\b(orders|everything|anything|all|purchases|bought|spent|spending)\b", re.IGNORECASE
)
_ORDER_NUMBER = re.compile(r"(?<![\w$,.-])\d{4,10}(?![\w,-])")
_ORDINAL = {"first": 0, "second": 1, "third": 2, "fourth": 3}


class NeedsToday(Exception):
    """Raised by `decide` when the message has a relative date and no `today` was given."""


@dataclass(frozen=True)
class StoredSet:
    """A result set as the resolver sees it: where it came from, what it asked, what it found."""

    id: str
    query: dict[str, Any]
    order_ids: list[str]
    user_seq: int
    rows: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class Scope:
    """What a message itself says about a search: a date range and constraints."""

    placed_from: str | None = None
    placed_to: str | None = None
    min_total: float | None = None
    status: str | None = None

    @property
    def has_dates(self) -> bool:
        return self.placed_from is not None

    @property
    def constraints(self) -> dict[str, Any]:
        found = {"min_total": self.min_total, "status": self.status}
        return {k: v for k, v in found.items() if v is not None}

    def query(self) -> dict[str, Any]:
        found = {"placed_from": self.placed_from, "placed_to": self.placed_to}
        return {**{k: v for k, v in found.items() if v is not None}, **self.constraints}


SetKind = Literal["new", "refine", "referent", "clarify", "none"]


@dataclass(frozen=True)
class SetResolution:
    kind: SetKind
    # The search the server worked out (new scope, refinement): `search_orders` arguments.
    query: dict[str, Any] | None = None
    # The set referred to or refined.
    target: StoredSet | None = None
    clarification: Clarification | None = None
    # A constraint waiting on the answer to `clarification` (kept in the pending slot).
    refine: dict[str, Any] | None = None

    def pending_slot_value(self) -> dict[str, Any]:
        assert self.clarification is not None
        return {**self.clarification.as_slot_value(), "refine": self.refine}

    def as_state(self) -> dict[str, Any] | None:
        """What the state block tells the model (None: nothing about result sets)."""
        if self.kind in ("new", "refine") and self.query is not None:
            state: dict[str, Any] = {
                "kind": self.kind,
                "query": self.query,
                "about": describe_query(self.query),
                "hint": "call search_orders with exactly `query` as its arguments",
            }
            if self.target is not None:
                state["refines"] = self.target.id
            return state
        if self.kind == "referent" and self.target is not None:
            t = self.target
            return {
                "kind": "referent",
                "result_set_id": t.id,
                "about": describe_query(t.query),
                "count": len(t.order_ids),
                "order_ids": t.order_ids,
                "rows": t.rows,
            }
        return None


# --- reading a message ----------------------------------------------------------------------


def week_before(today: date) -> tuple[date, date]:
    """The previous calendar week, Monday to Sunday."""
    monday = today - timedelta(days=today.weekday())
    return monday - timedelta(days=7), monday - timedelta(days=1)


def _month(year: int, month: int) -> tuple[date, date]:
    return date(year, month, 1), date(year, month, calendar.monthrange(year, month)[1])


def _relative_range(unit: str, which: str, today: date) -> tuple[date, date]:
    if unit == "yesterday":
        return today - timedelta(days=1), today - timedelta(days=1)
    if unit == "week":
        if which == "this":
            return today - timedelta(days=today.weekday()), today
        if which == "past":
            return today - timedelta(days=7), today
        return week_before(today)
    if which == "last":
        last_of_previous = today.replace(day=1) - timedelta(days=1)
        return _month(last_of_previous.year, last_of_previous.month)
    if which == "past":
        return today - timedelta(days=30), today
    return today.replace(day=1), today


def date_range(text: str, today: date | None) -> tuple[date, date] | None:
    """The date range a message names, if any: relative phrases first, then a month name
    (the latest such month that has begun)."""
    relative, month = _RELATIVE.search(text), _MONTH.search(text)
    if relative is None and month is None:
        return None
    if today is None:
        raise NeedsToday
    if relative is not None:
        which, unit = (relative.group(1) or "").lower(), relative.group(2) or relative.group(3)
        return _relative_range(unit.lower(), which, today)
    assert month is not None
    number = _MONTHS[month.group(1).lower()]
    year = today.year if number <= today.month else today.year - 1
    return _month(year, number)


def _min_total(text: str) -> float | None:
    found = _OVER.search(text)
    if found is None:
        return None
    return float(Decimal(found.group(1).replace(",", "") + (found.group(2) or "")))


def _status(text: str) -> str | None:
    for found in _STATUS.finditer(text):
        if not _NEGATED.search(text[: found.start()]):
            word = found.group(1).lower()
            return "cancelled" if word.startswith("cancel") else word
    return None


# A month named anywhere ("my October spending"), for `mentions_scope` only: "May" counts
# only after a preposition (`_MONTH`), as the verb is far more common.
_MONTH_ANYWHERE = re.compile(
    r"\b(" + "|".join(n for n in _MONTHS if len(n) > 3 and n != "may") + r")\b", re.IGNORECASE
)
_ORDERS_WORD = re.compile(
    r"\b(orders?|ordered|buy|bought|purchases?|purchased|spen[dt]|spending|everything|all)\b",
    re.IGNORECASE,
)


def mentions_scope(text: str) -> bool:
    """Whether a message asks about orders by period, amount or status: what a search of
    orders filters by. Generous where `decide` is strict (a tool offered in vain costs tokens,
    one withheld costs the answer), but a message naming an order number is about that order."""
    if _ORDER_NUMBER.search(_OVER.sub("", text)):
        return False
    named = (
        _RELATIVE.search(text)
        or _MONTH.search(text)
        or _MONTH_ANYWHERE.search(text)
        or _OVER.search(text)
        or _STATUS.search(text)
    )
    return named is not None and _ORDERS_WORD.search(text) is not None


def read_scope(text: str, today: date | None) -> Scope:
    dates = date_range(text, today)
    return Scope(
        placed_from=dates[0].isoformat() if dates else None,
        placed_to=dates[1].isoformat() if dates else None,
        min_total=_min_total(text),
        status=_status(text),
    )


# --- the ladder -----------------------------------------------------------------------------


def latest_sets(sets: list[StoredSet]) -> list[StoredSet]:
    """The sets the most recent searching turn left, in the order they were made."""
    if not sets:
        return []
    newest = max(s.user_seq for s in sets)
    return [s for s in sets if s.user_seq == newest]


def decide(
    text: str,
    *,
    sets: list[StoredSet],
    pending: dict[str, Any] | None = None,
    today: date | None = None,
) -> SetResolution:
    """Which result set, or which new search, a message means (see the module docstring)."""
    picked = answered(text, sets, pending)
    if picked is not None:
        return picked
    if _ORDER_NUMBER.search(_OVER.sub("", text)):
        return SetResolution("none")  # a stated order id: the order resolver's business
    scope = read_scope(text, today)
    latest = latest_sets(sets)
    if scope.has_dates and (_SEARCHY.search(text) or sets):
        return SetResolution("new", query=scope.query())
    narrowing = bool(_NARROW.search(text) or _ANAPHOR.search(text))
    if scope.constraints:
        if latest and (narrowing or not _SEARCHY.search(text)):
            return _one_of(latest, text, refine=scope.constraints)
        if _SEARCHY.search(text):
            return SetResolution("new", query=scope.query())
    if _ANAPHOR.search(text) and latest:
        return _one_of(latest, text, refine=None)
    return SetResolution("none")


def _one_of(latest: list[StoredSet], text: str, *, refine: dict[str, Any] | None) -> SetResolution:
    if len(latest) > 1:
        return SetResolution("clarify", clarification=_question(latest), refine=refine)
    return _use(latest[0], refine)


def _use(target: StoredSet, refine: dict[str, Any] | None) -> SetResolution:
    if refine:
        return SetResolution("refine", query=refined(target.query, refine), target=target)
    return SetResolution("referent", target=target)


def refined(query: dict[str, Any], constraints: dict[str, Any]) -> dict[str, Any]:
    """The stored query narrowed: same dates, the new constraints replacing old ones."""
    return {**query, **constraints}


def _question(latest: list[StoredSet]) -> Clarification:
    options = [
        Option(
            label=describe_set(s),
            value=f"The {describe_set(s)}",
            type=RESULT_SET,
            id=s.id,
            order_id="",
        )
        for s in latest
    ]
    named = " or ".join(o.label for o in options)
    return Clarification(f"Which results do you mean: {named}?", options)


def answered(
    text: str, sets: list[StoredSet], pending: dict[str, Any] | None
) -> SetResolution | None:
    """Rung 1: the user's pick among the sets we offered (by option text or ordinal)."""
    if not pending or not all(o.get("type") == RESULT_SET for o in pending.get("options", [])):
        return None
    options = pending.get("options") or []
    lowered = " ".join(text.lower().split())
    chosen = [o for o in options if o["value"].lower() in lowered or o["label"].lower() in lowered]
    if len(chosen) != 1:
        ordinal = re.search(r"\b(" + "|".join(_ORDINAL) + r")\b", lowered)
        index = _ORDINAL[ordinal.group(1)] if ordinal else None
        chosen = [options[index]] if index is not None and index < len(options) else []
    target = next((s for s in sets if chosen and s.id == chosen[0]["id"]), None)
    if target is None:
        return None
    return _use(target, pending.get("refine"))


# --- words and files ------------------------------------------------------------------------


def _day(value: str) -> str:
    d = date.fromisoformat(value)
    return f"{d:%b} {d.day}"


def _usd(value: float) -> str:
    return f"${value:,.2f}"


def describe_query(query: dict[str, Any]) -> str:
    """'orders over $500.00 placed Oct 19 – Oct 25' from search arguments."""
    words = [f"{query['status']} orders" if query.get("status") else "orders"]
    if query.get("min_total") is not None:
        words.append(f"over {_usd(float(query['min_total']))}")
    start, end = query.get("placed_from"), query.get("placed_to")
    if start and end:
        words.append(f"placed {_day(start)} – {_day(end)}")
    elif start:
        words.append(f"placed since {_day(start)}")
    elif end:
        words.append(f"placed until {_day(end)}")
    return " ".join(words)


def describe_set(stored: StoredSet) -> str:
    count = len(stored.order_ids)
    about = describe_query(stored.query)
    if count == 1:
        about = about.replace("orders", "order", 1)
    return f"{count} {about}"


def orders_csv(rows: list[dict[str, Any]]) -> str:
    """The export file: one line per row, in the set's order, the columns of CSV_COLUMNS."""
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=CSV_COLUMNS, extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()
