"""A tenant's month over its budget: the operator's approval (parley/budget_approvals.py).

When the tenant's monthly budget first refuses a turn, an approval is asked (its workflow,
`budget-<tenant>-<YYYY-MM>`, waits in the Temporal UI). The operator reads it here and
decides: approve (turns go on for the rest of the month, under a new ceiling if given) or
decline. The decision is committed, then the workflow is told. Admins decide their own
tenant's only; any other tenant is 404.
"""

from __future__ import annotations

import logging
from datetime import UTC, date, datetime
from decimal import Decimal

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict

from parley.api.deps import Admin, DbSession, Temporal
from parley.api.errors import answers
from parley.budget_approvals import Decision, approval_id, decided_status
from parley.dispatch.budgets import tell_budget_approval
from parley.errors import BudgetApprovalDecided, Forbidden, InvalidRequest, NotFound
from parley.store import budgets
from parley.tenancy import Money
from parley.wire import Timestamp

log = logging.getLogger(__name__)

router = APIRouter(
    prefix="/v1/admin/tenants/{tenant_id}/budget",
    tags=["admin"],
    responses=answers(Forbidden, NotFound),
)


class BudgetApprovalOut(BaseModel):
    """The month's approval: `waiting` for an operator, then `approved`, `declined` or
    `timed_out`. Money is a decimal string in USD."""

    approval_id: str  # the workflow's id in the Temporal UI
    tenant_id: str
    period_start: date  # the month's first day (UTC)
    status: str
    timeout_s: float
    # An approval's new monthly ceiling; null on an approval: no ceiling this month.
    monthly_usd: str | None
    decided_by: str | None
    decided_at: Timestamp | None
    requested_at: Timestamp

    @classmethod
    def of(cls, row: budgets.Approval) -> BudgetApprovalOut:
        limit = None if row.limit_usd is None else format(row.limit_usd.normalize(), "f")
        return cls(
            approval_id=row.id,
            tenant_id=row.tenant_id,
            period_start=row.period_start,
            status=row.status,
            timeout_s=row.timeout_s,
            monthly_usd=limit,
            decided_by=row.decided_by,
            decided_at=row.decided_at,
            requested_at=row.created_at,
        )


class BudgetDecisionIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    decision: Decision
    # With `approve`: the month's new ceiling in USD; unset, the month has none.
    monthly_usd: Money | None = None


def _this_month() -> date:
    return datetime.now(UTC).date().replace(day=1)


@router.get("/approval")
async def get_approval(tenant_id: str, db: DbSession, _: Admin) -> BudgetApprovalOut:
    """This month's approval to go over the tenant's budget (404 when none was asked)."""
    found = await budgets.approval(db, tenant_id=tenant_id, period_start=_this_month())
    if found is None:
        raise NotFound("no budget approval was asked this month")
    return BudgetApprovalOut.of(found)


@router.post("/approval", responses=answers(BudgetApprovalDecided, InvalidRequest))
async def decide_approval(
    tenant_id: str, body: BudgetDecisionIn, db: DbSession, admin: Admin, temporal: Temporal
) -> BudgetApprovalOut:
    """Decide this month's waiting approval: `approve` lets the tenant's turns go on for the
    rest of the month (under `monthly_usd` if given), `decline` keeps them refused."""
    if body.decision == Decision.decline and body.monthly_usd is not None:
        raise InvalidRequest("a decline takes no new ceiling", field="monthly_usd")
    month = _this_month()
    found = await budgets.approval(db, tenant_id=tenant_id, period_start=month)
    if found is None:
        raise NotFound("no budget approval was asked this month")
    limit = None if body.monthly_usd is None else Decimal(body.monthly_usd)
    decided = await budgets.decide(
        db,
        approval_id=approval_id(tenant_id=tenant_id, period_start=month),
        status=decided_status(body.decision),
        by=admin.user_id,
        limit_usd=limit,
    )
    if decided is None:
        raise BudgetApprovalDecided(
            f"this month's approval is {found.status} already", status=found.status
        )
    await db.commit()
    try:
        client = await temporal.get()
    except Exception:
        log.warning("Temporal is away: budget approval %s was not told", decided.id)
    else:
        await tell_budget_approval(client, decided)
    return BudgetApprovalOut.of(decided)
