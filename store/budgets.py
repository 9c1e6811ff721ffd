"""Budgets' spend (`budget_spend`), each model call's reservation (`budget_holds`) and the
notices of a soft threshold crossed (`budget_notices`): the one owner of those tables.

Before a model call its worst case is reserved against every budget it falls under, by one
conditional upsert per budget row, in one transaction: a budget row is locked while it is
checked and moved, so concurrent reservations in any worker never together pass the limit
(`spent + reserved + amount <= limit`), and a call that fails one budget reserves against
none. The reservation is held per call: a retried attempt finds its call's holds and
reserves nothing again. After the call, the settle statement deletes the call's holds and
moves their amount from reserved to the call's real cost, in one statement, so a settle run
twice (a retry) moves nothing the second time.

A settle whose spend crosses the soft share of a budget writes its notice (once per budget
and period: spend only grows within a period, so it crosses once). Nothing here commits
except `reserve`'s own transaction (see `store`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date
from decimal import Decimal

from psycopg.types.json import Jsonb

from parley.costs import BudgetTake
from parley.store.db import Db


class _Refused(Exception):
    """Undoes a reservation's transaction when one of its budgets refused."""


async def reserve(db: Db, *, call_id: str, takes: list[BudgetTake], amount: Decimal) -> list[str]:
    """Reserve `amount` against every budget of `takes` for the call (nothing when the call
    holds its reservation already); the budgets that refused ("subject period"), empty when
    it is reserved."""
    rows = [
        {
            "ord": n,
            "subject": t.subject,
            "period": t.period,
            "period_start": t.period_start.isoformat(),
            "limit_usd": str(t.limit_usd),
        }
        for n, t in enumerate(takes)
    ]
    params = {"call": call_id, "takes": Jsonb(rows), "amount": amount}
    refused: list[str] = []
    try:
        async with db.transaction():
            found = await db.row(_RESERVE, params, _Reserved)
            assert found is not None
            if found.held == 0 and found.taken < len(takes):
                taken = set(found.subjects or [])
                refused = [f"{t.subject} {t.period}" for t in takes if t.key not in taken]
                raise _Refused
    except _Refused:
        return refused
    return []


@dataclass(frozen=True)
class _Reserved:
    held: int
    taken: int
    subjects: list[str] | None


# A notice names its tenant: the subject's ("tenant:<t>", "user:<t>/<u>").
# The takes in `takes`' order (the order of the locks); a hold already there takes nothing.
_RESERVE = """
    WITH held AS (
        SELECT count(*) AS n FROM budget_holds WHERE call_id = %(call)s
    ), takes AS (
        SELECT t.subject, t.period, t.period_start, t.limit_usd, t.ord
        FROM jsonb_to_recordset(%(takes)s)
            AS t(ord int, subject text, period text, period_start date, limit_usd numeric)
    ), taken AS (
        INSERT INTO budget_spend AS b (subject, period, period_start, reserved_usd, limit_usd)
        SELECT t.subject, t.period, t.period_start, %(amount)s, t.limit_usd
        FROM takes AS t, held
        WHERE held.n = 0 AND %(amount)s <= t.limit_usd
        ORDER BY t.ord
        ON CONFLICT (subject, period, period_start) DO UPDATE
            SET reserved_usd = b.reserved_usd + EXCLUDED.reserved_usd,
                limit_usd = EXCLUDED.limit_usd
            WHERE b.spent_usd + b.reserved_usd + EXCLUDED.reserved_usd <= EXCLUDED.limit_usd
        RETURNING b.subject, b.period, b.period_start
    ), holds AS (
        INSERT INTO budget_holds (call_id, subject, period, period_start, amount_usd)
        SELECT %(call)s, subject, period, period_start, %(amount)s FROM taken
    )
    SELECT (SELECT n FROM held) AS held, (SELECT count(*) FROM taken) AS taken,
        (SELECT array_agg(subject || ' ' || period) FROM taken) AS subjects
"""


@dataclass(frozen=True)
class Crossed:
    """A budget whose soft share this settle crossed (its notice is written)."""

    subject: str
    period: str
    period_start: date
    spent_usd: Decimal
    limit_usd: Decimal


async def settle(db: Db, *, call_id: str, cost: Decimal, soft_share: Decimal) -> list[Crossed]:
    """Move the call's reservation to its real cost (nothing when it holds none: settled
    already, or reserved nothing); the budgets whose soft share this crossed."""
    params = {"call": call_id, "cost": cost, "share": soft_share}
    return await db.rows(_SETTLE, params, Crossed)


_SETTLE = """
    WITH gone AS (
        DELETE FROM budget_holds WHERE call_id = %(call)s
        RETURNING subject, period, period_start, amount_usd
    ), moved AS (
        UPDATE budget_spend AS b
        SET reserved_usd = greatest(b.reserved_usd - g.amount_usd, 0),
            spent_usd = b.spent_usd + %(cost)s
        FROM gone AS g
        WHERE b.subject = g.subject AND b.period = g.period AND b.period_start = g.period_start
        RETURNING b.subject, b.period, b.period_start, b.spent_usd, b.limit_usd
    ), crossed AS (
        SELECT * FROM moved
        WHERE moved.spent_usd >= moved.limit_usd * %(share)s
            AND moved.spent_usd - %(cost)s < moved.limit_usd * %(share)s
    ), noticed AS (
        INSERT INTO budget_notices (subject, period, period_start, tenant_id, spent_usd,
            limit_usd)
        SELECT subject, period, period_start,
            split_part(split_part(subject, ':', 2), '/', 1), spent_usd, limit_usd
        FROM crossed
        ON CONFLICT DO NOTHING
    )
    SELECT subject, period, period_start, spent_usd, limit_usd FROM crossed
"""


@dataclass(frozen=True)
class Spend:
    subject: str
    period: str
    period_start: date
    spent_usd: Decimal
    reserved_usd: Decimal
    limit_usd: Decimal


async def spend(db: Db, *, subject: str) -> list[Spend]:
    """A subject's budget periods, newest first."""
    return await db.rows(_SPEND, {"subject": subject}, Spend)


_SPEND = """
    SELECT subject, period, period_start, spent_usd, reserved_usd, limit_usd
    FROM budget_spend WHERE subject = %(subject)s ORDER BY period_start DESC, period
"""
