"""The budget approval workflow's steps (workflows/budget_approval.py): tell the tenant's
webhook that an operator is asked, and end a wait nobody answered.

Both only ask the store (and the webhook): the decision itself is committed by the admin
route (api/routes/budgets.py) and read by every model call's reservation (store/budgets.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from temporalio import activity

from parley.activities.webhooks import WebhookSender, plan_budget_delivery
from parley.budget_approvals import BudgetApprovalInput, BudgetApprovalOutcome
from parley.config import Settings
from parley.egress import Resolver
from parley.gateway.resolver import system_resolver
from parley.store import budgets
from parley.store.db import Database, Db
from parley.webhooks import BUDGET_EVENT, delivery_id


def outcome(approval: budgets.Approval) -> BudgetApprovalOutcome:
    decided_at = approval.decided_at.isoformat() if approval.decided_at else None
    return BudgetApprovalOutcome(approval.status, approval.decided_by, decided_at)


class BudgetApprovalActivities:
    def __init__(
        self, *, sessions: Database, settings: Settings, resolve: Resolver = system_resolver
    ) -> None:
        self._sessions = sessions
        self._sender = WebhookSender(
            sessions=sessions, allowlist=settings.mcp_allowlist, resolve=resolve
        )

    def steps(self) -> list[Callable[..., Any]]:
        """The workflow's steps, as the worker registers them."""
        return [self.ask_operator, self.time_out_approval]

    @activity.defn
    async def ask_operator(self, inp: BudgetApprovalInput) -> str:
        """Tell the tenant's webhook that its month's budget is used up and an operator may
        approve going on (`budget`, `approval_requested`): the same signed body under the
        same idempotency key on every attempt. The delivery's status (`none`: no webhook)."""
        async with self._sessions() as db:
            payload = await _approval_payload(db, inp)
            planned = await plan_budget_delivery(
                db,
                tenant_id=inp.tenant_id,
                delivery_id=delivery_id(handoff_id=inp.approval_id, event=BUDGET_EVENT),
                payload=payload,
            )
            await db.commit()
        return await self._sender.deliver(planned)

    @activity.defn
    async def time_out_approval(self, inp: BudgetApprovalInput) -> BudgetApprovalOutcome:
        """Nobody decided in time: the approval is `timed_out`, unless the store holds a
        decision whose signal was lost (then that decision). How it ended."""
        async with self._sessions() as db:
            ended = await budgets.time_out(db, approval_id=inp.approval_id)
            await db.commit()
        return outcome(ended)


async def _approval_payload(db: Db, inp: BudgetApprovalInput) -> dict[str, Any]:
    """What the team's tools are told: the month, what it spent of what limit, and how long an
    operator has (the decision is `POST /v1/admin/tenants/{tenant_id}/budget/approval`)."""
    month = [
        s
        for s in await budgets.spend(db, subject=f"tenant:{inp.tenant_id}")
        if s.period == "month" and s.period_start.isoformat() == inp.period_start
    ]
    return {
        "event": BUDGET_EVENT,
        "kind": "approval_requested",
        "tenant_id": inp.tenant_id,
        "approval_id": inp.approval_id,
        "period": "month",
        "period_start": inp.period_start,
        "spent_usd": str(month[0].spent_usd) if month else None,
        "limit_usd": str(month[0].limit_usd) if month else None,
        "timeout_s": inp.timeout_s,
    }
