"""The budget approval workflow: a tenant's month over its budget, waiting for an operator.

One run per tenant and month (`budget-<tenant>-<YYYY-MM>`, searchable by `ParleyTenantId`),
started when the tenant's monthly budget first refuses a turn (parley/budget_approvals.py).
It tells the tenant's webhook that an operator is asked, then waits for the decision as long
as the tenant's `approval_timeout_s` (a durable timer, shown in the Temporal UI). The store
holds the truth: the admin route commits the decision (who, when, a new ceiling) and then
tells this run by signal; at the timeout the run asks the store, which keeps a decision whose
signal was lost and otherwise marks the approval `timed_out`. The result says how it ended,
who decided and when. Only ids and the wait travel through history, never an amount.

Pinned like every workflow of the worker (dispatch/deployment.py); its build 1 recordings are
tests/histories/budget_v1_*.json (tests/workflow/test_budget_approval_workflow.py).
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from parley.activities.budget_approvals import BudgetApprovalActivities
    from parley.budget_approvals import (
        BUDGET_APPROVAL_WORKFLOW,
        BUDGET_DECIDED_SIGNAL,
        ApprovalStatus,
        BudgetApprovalInput,
        BudgetApprovalOutcome,
        BudgetDecided,
    )

from parley.workflows.options import STORE, WEBHOOK


@workflow.defn(name=BUDGET_APPROVAL_WORKFLOW)
class BudgetApprovalWorkflow:
    def __init__(self) -> None:
        self._decided: BudgetDecided | None = None

    @workflow.query
    def status(self) -> str:
        """The approval's status as this run knows it."""
        return ApprovalStatus.waiting if self._decided is None else self._decided.status

    @workflow.signal(name=BUDGET_DECIDED_SIGNAL)
    def decided(self, decision: BudgetDecided) -> None:
        """The store has the operator's decision; the first one told stands."""
        if self._decided is None:
            self._decided = decision

    @workflow.run
    async def run(self, inp: BudgetApprovalInput) -> BudgetApprovalOutcome:
        asked = WEBHOOK.start(
            BudgetApprovalActivities.ask_operator, inp, summary="webhook: approval requested"
        )
        workflow.set_current_details(
            f"waiting for an operator to approve going over the budget ({inp.timeout_s:g} s)"
        )
        try:
            await workflow.wait_condition(
                lambda: self._decided is not None,
                timeout=timedelta(seconds=inp.timeout_s),
                timeout_summary="nobody decided in time",
            )
            assert self._decided is not None
            d = self._decided
            ended = BudgetApprovalOutcome(d.status, d.decided_by, d.decided_at)
        except TimeoutError:
            ended = await STORE.run(
                BudgetApprovalActivities.time_out_approval, inp, summary="timed out"
            )
        workflow.set_current_details(f"{ended.status} by {ended.decided_by or 'nobody'}")
        try:
            await asked  # a webhook that stays down is in its delivery log
        except ActivityError:
            workflow.logger.warning("a budget webhook delivery gave up")
        return ended
