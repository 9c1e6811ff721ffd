"""Budgets' spend (`budget_spend`), each model call's reservation (`budget_holds`), the
notices of a soft threshold crossed (`budget_notices`) and the operators' approvals of a
tenant's month over its budget (`budget_approvals`): the one owner of those tables.

Before a model call its worst case is reserved against every budget it falls under, by one
conditional upsert per budget row, in one transaction: a budget row is locked while it is
checked and moved, so concurrent reservations in any worker never together pass the limit
(`spent + reserved + amount <= limit`), and a call that fails one budget reserves against
none. The reservation is held per call: a retried attempt finds its call's holds and
reserves nothing again. After the call, the settle statement deletes the call's holds and
moves their amount from reserved to the call's real cost, in one statement, so a settle run
twice (a retry) moves nothing the second time.

A settle whose spend crosses the soft share of a budget writes its notice (once per budget
and period: spend only grows within a period, so it crosses once).

A tenant's month that its operator approved going over (parley/budget_approvals.py) is
reserved against the approval's new ceiling, or without a limit when it gave none: the
reservation's statement reads the approval itself, so the check costs no extra round trip.
Nothing here commits except `reserve`'s own transaction (see `store`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime, timedelta
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


# An operator's approval of a tenant's month (`a`) that applies to a budget row (`{s}`): its
# new ceiling replaces the configured limit, and one without a ceiling lifts the limit.
_APPROVED_FOR = """
    {s}.period = 'month' AND {s}.subject LIKE 'tenant:%%'
    AND a.tenant_id = substr({s}.subject, 8) AND a.period_start = {s}.period_start
    AND a.status = 'approved'
"""

# The takes in `takes`' order (the order of the locks); a hold already there takes nothing.
# A tenant's month approved by its operator (`budget_approvals`) holds to the approval.
_RESERVE = f"""
    WITH held AS (
        SELECT count(*) AS n FROM budget_holds WHERE call_id = %(call)s
    ), takes AS (
        SELECT t.subject, t.period, t.period_start, t.ord,
            coalesce(a.limit_usd, t.limit_usd) AS limit_usd,
            (a.id IS NOT NULL AND a.limit_usd IS NULL) AS open
        FROM jsonb_to_recordset(%(takes)s)
            AS t(ord int, subject text, period text, period_start date, limit_usd numeric)
        LEFT JOIN budget_approvals AS a
            ON {_APPROVED_FOR.format(s="t")}
    ), taken AS (
        INSERT INTO budget_spend AS b (subject, period, period_start, reserved_usd, limit_usd)
        SELECT t.subject, t.period, t.period_start, %(amount)s, t.limit_usd
        FROM takes AS t, held
        WHERE held.n = 0 AND (t.open OR %(amount)s <= t.limit_usd)
        ORDER BY t.ord
        ON CONFLICT (subject, period, period_start) DO UPDATE
            SET reserved_usd = b.reserved_usd + EXCLUDED.reserved_usd,
                limit_usd = EXCLUDED.limit_usd
            WHERE b.spent_usd + b.reserved_usd + EXCLUDED.reserved_usd <= EXCLUDED.limit_usd
                OR EXISTS (
                    SELECT FROM budget_approvals AS a
                    WHERE {_APPROVED_FOR.format(s="b")} AND a.limit_usd IS NULL
                )
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


# --- the operator's approval of a tenant's month over its budget -----------------------------


@dataclass(frozen=True)
class Approval:
    """A tenant's month over its budget and the operator's decision (parley/budget_approvals.py)."""

    id: str
    tenant_id: str
    period_start: date
    status: str
    timeout_s: float
    limit_usd: Decimal | None
    decided_by: str | None
    decided_at: datetime | None
    created_at: datetime
    workflow_started_at: datetime | None


_APPROVAL = (
    "id, tenant_id, period_start, status, timeout_s, limit_usd, decided_by, decided_at, "
    "created_at, workflow_started_at"
)


async def ask_approval(
    db: Db, *, approval_id: str, tenant_id: str, period_start: date, timeout_s: float
) -> Approval | None:
    """The month's approval, asked for now; None when it was asked already this month (however
    many turns are refused at once, one asks)."""
    params = {
        "id": approval_id,
        "tenant_id": tenant_id,
        "period_start": period_start,
        "timeout_s": timeout_s,
    }
    return await db.row(_ASK, params, Approval)


_ASK = f"""
    INSERT INTO budget_approvals (id, tenant_id, period_start, status, timeout_s)
    VALUES (%(id)s, %(tenant_id)s, %(period_start)s, 'waiting', %(timeout_s)s)
    ON CONFLICT DO NOTHING
    RETURNING {_APPROVAL}
"""


async def approval(db: Db, *, tenant_id: str, period_start: date) -> Approval | None:
    """The tenant's approval of that month, if one was asked."""
    params = {"tenant_id": tenant_id, "period_start": period_start}
    return await db.row(_APPROVAL_OF, params, Approval)


_APPROVAL_OF = f"""
    SELECT {_APPROVAL} FROM budget_approvals
    WHERE tenant_id = %(tenant_id)s AND period_start = %(period_start)s
"""


async def decide(
    db: Db, *, approval_id: str, status: str, by: str, limit_usd: Decimal | None
) -> Approval | None:
    """Store an operator's decision on a waiting approval (`approved` with its new ceiling,
    or none; `declined`); None when it is not waiting (decided, or timed out)."""
    params = {"id": approval_id, "status": status, "by": by, "limit": limit_usd}
    return await db.row(_DECIDE, params, Approval)


_DECIDE = f"""
    UPDATE budget_approvals
    SET status = %(status)s, decided_by = %(by)s, decided_at = now(), limit_usd = %(limit)s
    WHERE id = %(id)s AND status = 'waiting'
    RETURNING {_APPROVAL}
"""


async def time_out(db: Db, *, approval_id: str) -> Approval:
    """Nobody decided in time: `timed_out`, unless a decision was stored first (its signal
    lost); the approval as it ends."""
    row = await db.row(_TIME_OUT, {"id": approval_id}, Approval)
    if row is None:
        row = await db.row(_APPROVAL_BY_ID, {"id": approval_id}, Approval)
    assert row is not None, f"budget approval {approval_id} is missing"
    return row


_APPROVAL_BY_ID = f"SELECT {_APPROVAL} FROM budget_approvals WHERE id = %(id)s"
_TIME_OUT = f"""
    UPDATE budget_approvals SET status = 'timed_out'
    WHERE id = %(id)s AND status = 'waiting'
    RETURNING {_APPROVAL}
"""


async def unstarted_approvals(db: Db, *, older_than: timedelta) -> list[Approval]:
    """Approvals whose workflow's start was not marked within `older_than` (the process that
    asked died before starting it, or Temporal was away)."""
    return await db.rows(_UNSTARTED, {"older": older_than}, Approval)


_UNSTARTED = f"""
    SELECT {_APPROVAL} FROM budget_approvals
    WHERE workflow_started_at IS NULL AND created_at < now() - %(older)s
    ORDER BY created_at
"""


async def mark_approval_started(db: Db, *, approval_id: str) -> None:
    await db.run(_STARTED, {"id": approval_id})


_STARTED = """
    UPDATE budget_approvals SET workflow_started_at = coalesce(workflow_started_at, now())
    WHERE id = %(id)s
"""


# --- the soft threshold's notices, for the tenant's webhook ----------------------------------


@dataclass(frozen=True)
class Notice:
    """A soft threshold crossed, not yet delivered to the tenant's webhook."""

    subject: str
    period: str
    period_start: date
    tenant_id: str
    spent_usd: Decimal
    limit_usd: Decimal
    # The delivery's id and the receiver's idempotency key: one per budget and period.
    delivery_id: str

    def payload(self, event: str) -> dict[str, str]:
        return {
            "event": event,
            "kind": "soft_threshold",
            "tenant_id": self.tenant_id,
            "subject": self.subject,
            "period": self.period,
            "period_start": self.period_start.isoformat(),
            "spent_usd": str(self.spent_usd),
            "limit_usd": str(self.limit_usd),
        }


async def undelivered_notices(db: Db, *, max_attempts: int) -> list[Notice]:
    """Notices of tenants with a webhook that it has not taken yet, and whose delivery is
    neither refused (the egress rules) nor out of attempts; oldest first."""
    return await db.rows(_UNDELIVERED, {"max": max_attempts}, Notice)


_NOTICE_DELIVERY = (
    "'whk_bgt_' || md5(n.subject || ' ' || n.period || ' ' || n.period_start) || '_budget'"
)
_UNDELIVERED = f"""
    SELECT n.subject, n.period, n.period_start, n.tenant_id, n.spent_usd, n.limit_usd,
        {_NOTICE_DELIVERY} AS delivery_id
    FROM budget_notices AS n
    JOIN tenants AS t ON t.id = n.tenant_id AND t.config -> 'handoff_webhook' IS NOT NULL
    LEFT JOIN webhook_deliveries AS d ON d.id = {_NOTICE_DELIVERY}
    WHERE n.delivered_at IS NULL
        AND (d.id IS NULL OR d.status = 'delivered'
            OR (d.status <> 'refused' AND d.attempts < %(max)s))
    ORDER BY n.created_at
    LIMIT 50
"""


async def notice_delivered(db: Db, *, notice: Notice) -> None:
    params = {"subject": notice.subject, "period": notice.period, "start": notice.period_start}
    await db.run(_NOTICE_DELIVERED, params)


_NOTICE_DELIVERED = """
    UPDATE budget_notices SET delivered_at = coalesce(delivered_at, now())
    WHERE subject = %(subject)s AND period = %(period)s AND period_start = %(start)s
"""
