"""The cost ledger: one row per model call (`model_costs`), written once, and its roll-ups.

A row's key is the call's own identity, not an attempt's: a turn's model call is
`call:<model_call_id>` (the row `build_context` wrote before any attempt), a summary run
`summary:<session>:<through_seq>`. Every write is `INSERT ... ON CONFLICT (key) DO
NOTHING`, so an activity retried after a crash (its outcome stored, its ledger row not yet,
or both) bills the call once. The call-model activity writes the row with the call's
outcome, in the same statement (`LEDGER_ROW`, composed), and again (finding it written, or
writing it now) when a retry finds the outcome stored (activities/turn.py).

Tenant, user and session are read from the turn's session by the same statement, so a row
is never written for a turn that does not exist. Roll-ups (per turn, session, user, model,
day, tenant) are queries over the rows of a period. Nothing here commits (see `store`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal
from typing import Literal

from parley.costs import CallCost
from parley.store.db import Db

Kind = Literal["turn", "summary", "specialist"]
By = Literal["user", "model", "day", "session", "turn"]


def call_key(model_call_id: str) -> str:
    return f"call:{model_call_id}"


def dropped_key(model_call_id: str, attempt: int) -> str:
    """An attempt of the call that broke off, its usage reported (the answering attempt's
    row is `call_key`'s)."""
    return f"call:{model_call_id}:dropped:{attempt}"


def summary_key(session_id: str, through_seq: int) -> str:
    return f"summary:{session_id}:{through_seq}"


def ledger_params(*, key: str, kind: Kind, turn_id: str, entry: CallCost) -> dict[str, object]:
    """The parameters of `LEDGER_ROW` (prefixed, so they sit beside a composing statement's)."""
    usage = entry.usage
    return {
        "lc_key": key,
        "lc_kind": kind,
        "lc_turn_id": turn_id,
        "lc_provider": entry.provider,
        "lc_model": entry.model,
        "lc_input_tokens": usage.input_tokens,
        "lc_cached_tokens": usage.cached_tokens,
        "lc_cache_write_tokens": usage.cache_write_tokens,
        "lc_output_tokens": usage.output_tokens,
        "lc_estimated": usage.estimated,
        "lc_cost_usd": entry.cost_usd,
    }


async def record_turn_call(db: Db, *, key: str, turn_id: str, kind: Kind, entry: CallCost) -> bool:
    """The ledger's row for one of a turn's model calls, unless it is written already;
    whether this wrote it."""
    params = ledger_params(key=key, kind=kind, turn_id=turn_id, entry=entry)
    return bool(await db.run(LEDGER_ROW, params))


async def record_session_call(db: Db, *, key: str, session_id: str, entry: CallCost) -> bool:
    """The ledger's row for a session's model call outside any turn (the summarizer's)."""
    params = {**ledger_params(key=key, kind="summary", turn_id="", entry=entry)}
    return bool(await db.run(_RECORD_SESSION_CALL, {**params, "session_id": session_id}))


async def is_recorded(db: Db, *, key: str) -> bool:
    return bool(await db.value(_RECORDED, {"key": key}))


_COLUMNS = """(key, tenant_id, user_id, session_id, turn_id, kind, provider, model,
        input_tokens, cached_tokens, cache_write_tokens, output_tokens, estimated, cost_usd)"""
_VALUES = """%(lc_kind)s, %(lc_provider)s, %(lc_model)s, %(lc_input_tokens)s,
        %(lc_cached_tokens)s, %(lc_cache_write_tokens)s, %(lc_output_tokens)s,
        %(lc_estimated)s, %(lc_cost_usd)s"""
# A turn's model call's ledger row, unless written (parameters `ledger_params`; returns the
# key when this wrote it). Composed, as a CTE, into the statement that stores the call's
# outcome (store/steps.py `write_outcome`, store/turns/attempts.py `record_tool_requests`),
# so a call's outcome and its row are written together, in one round trip.
LEDGER_ROW = f"""
    INSERT INTO model_costs {_COLUMNS}
    SELECT %(lc_key)s, s.tenant_id, s.user_id, s.id, t.id, {_VALUES}
    FROM turns AS t JOIN sessions AS s ON s.id = t.session_id
    WHERE t.id = %(lc_turn_id)s
    ON CONFLICT (key) DO NOTHING
    RETURNING key
"""
_RECORD_SESSION_CALL = f"""
    INSERT INTO model_costs {_COLUMNS}
    SELECT %(lc_key)s, s.tenant_id, s.user_id, s.id, NULL, {_VALUES}
    FROM sessions AS s WHERE s.id = %(session_id)s
    ON CONFLICT (key) DO NOTHING
"""
_RECORDED = "SELECT EXISTS (SELECT 1 FROM model_costs WHERE key = %(key)s)"


# --- roll-ups ------------------------------------------------------------------------------


@dataclass(frozen=True)
class CostLine:
    """One group of a period's calls: what it is (`name`: a user id, `provider/model`, a
    day, a session or turn id; "" for the tenant's total), its calls, tokens and cost."""

    name: str
    calls: int
    input_tokens: int
    cached_tokens: int
    cache_write_tokens: int
    output_tokens: int
    # Calls whose tokens are Parley's own estimate, and calls no price was known for.
    estimated_calls: int
    unpriced_calls: int
    cost_usd: Decimal


# The group each roll-up names, over `model_costs` as `c`.
_GROUPS: dict[By | None, str] = {
    None: "''",
    "user": "coalesce(c.user_id, '')",
    "model": "c.provider || '/' || c.model",
    "day": "to_char(c.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD')",
    "session": "coalesce(c.session_id, '')",
    "turn": "coalesce(c.turn_id, '')",
}
_ROLL_UP = """
    SELECT {group} AS name, count(*) AS calls,
        coalesce(sum(c.input_tokens), 0)::bigint AS input_tokens,
        coalesce(sum(c.cached_tokens), 0)::bigint AS cached_tokens,
        coalesce(sum(c.cache_write_tokens), 0)::bigint AS cache_write_tokens,
        coalesce(sum(c.output_tokens), 0)::bigint AS output_tokens,
        count(*) FILTER (WHERE c.estimated) AS estimated_calls,
        count(*) FILTER (WHERE c.cost_usd IS NULL) AS unpriced_calls,
        coalesce(sum(c.cost_usd), 0) AS cost_usd
    FROM model_costs AS c
    WHERE c.tenant_id = %(tenant_id)s AND c.created_at >= %(start)s AND c.created_at < %(end)s
        AND (CAST(%(user_id)s AS varchar) IS NULL OR c.user_id = %(user_id)s)
        AND (CAST(%(session_id)s AS varchar) IS NULL OR c.session_id = %(session_id)s)
    GROUP BY 1 ORDER BY 1
"""
# Each roll-up's statement, by what it groups by (the group expression is one of `_GROUPS`,
# never a caller's text).
_ROLL_UPS = {by: _ROLL_UP.format(group=group) for by, group in _GROUPS.items()}


async def roll_up(
    db: Db,
    *,
    tenant_id: str,
    start: datetime,
    end: datetime,
    by: By | None = None,
    user_id: str | None = None,
    session_id: str | None = None,
) -> list[CostLine]:
    """The tenant's calls in [start, end), grouped `by` (None: one line, the total; no line
    when there were no calls), optionally of one user or one session."""
    params = {
        "tenant_id": tenant_id,
        "start": start,
        "end": end,
        "user_id": user_id,
        "session_id": session_id,
    }
    return await db.rows(_ROLL_UPS[by], params, CostLine)


async def turn_cost(db: Db, *, turn_id: str) -> Decimal:
    """A turn's model calls' cost, priced ones only."""
    found = await db.value(_TURN_COST, {"turn_id": turn_id})
    return Decimal(found or 0)


_TURN_COST = "SELECT sum(cost_usd) FROM model_costs WHERE turn_id = %(turn_id)s"


def day_bounds(start: date, end: date) -> tuple[datetime, datetime]:
    """[start, end] in whole UTC days as a half-open range of instants."""
    return (
        datetime.combine(start, time(), tzinfo=UTC),
        datetime.combine(end + timedelta(days=1), time(), tzinfo=UTC),
    )


# --- a period's report (the admin route and `parley usage` print the same) ----------------


@dataclass(frozen=True)
class CostReport:
    tenant_id: str
    start: date  # the first day, UTC
    end: date  # the last day, UTC, included
    by: By | None
    lines: list[CostLine]  # one per group (empty without `by`)
    total: CostLine

    def as_json(self) -> dict[str, object]:
        """Money as decimal strings (exact), tokens as integers."""
        return {
            "tenant_id": self.tenant_id,
            "from": self.start.isoformat(),
            "to": self.end.isoformat(),
            "by": self.by,
            "currency": "USD",
            "total": _line_json(self.total),
            "lines": [_line_json(line) for line in self.lines],
        }

    def as_csv(self) -> str:
        """One row per group (or the total alone without `by`), with a header."""
        columns = [self.by or "tenant", *CSV_FIELDS]
        rows = [",".join(columns)]
        for line in self.lines or [replace(self.total, name=self.tenant_id)]:
            found = _line_json(line)
            rows.append(",".join(_csv_cell(str(found[c])) for c in ["name", *CSV_FIELDS]))
        return "\n".join(rows) + "\n"


CSV_FIELDS = [
    "calls",
    "input_tokens",
    "cached_tokens",
    "cache_write_tokens",
    "output_tokens",
    "estimated_calls",
    "unpriced_calls",
    "cost_usd",
]


def _line_json(line: CostLine) -> dict[str, object]:
    return {
        "name": line.name,
        "calls": line.calls,
        "input_tokens": line.input_tokens,
        "cached_tokens": line.cached_tokens,
        "cache_write_tokens": line.cache_write_tokens,
        "output_tokens": line.output_tokens,
        "estimated_calls": line.estimated_calls,
        "unpriced_calls": line.unpriced_calls,
        "cost_usd": money(line.cost_usd),
    }


def money(amount: Decimal) -> str:
    """USD exactly as the ledger sums it, without trailing zeros past the cent."""
    text = format(Decimal(amount).quantize(Decimal("0.0000000001")), "f").rstrip("0")
    whole, _, cents = text.partition(".")
    return f"{whole}.{cents.ljust(2, '0')}"


def _csv_cell(text: str) -> str:
    """A cell quoted when it holds a comma or a quote; one that a spreadsheet would run as a
    formula (=, +, -, @) is prefixed with a quote mark."""
    if text[:1] in ("=", "+", "@") or (text[:1] == "-" and not text[1:2].isdigit()):
        text = "'" + text
    if any(ch in text for ch in ',"\n'):
        text = '"' + text.replace('"', '""') + '"'
    return text


_EMPTY = CostLine("", 0, 0, 0, 0, 0, 0, 0, Decimal(0))


async def cost_report(
    db: Db, *, tenant_id: str, start: date, end: date, by: By | None = None
) -> CostReport:
    """The tenant's cost in the UTC days [start, end], grouped `by`, with its total."""
    since, until = day_bounds(start, end)
    total = await roll_up(db, tenant_id=tenant_id, start=since, end=until)
    lines = await roll_up(db, tenant_id=tenant_id, start=since, end=until, by=by) if by else []
    return CostReport(tenant_id, start, end, by, lines, total[0] if total else _EMPTY)
