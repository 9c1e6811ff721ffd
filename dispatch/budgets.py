"""Starting a tenant's budget approval run, telling it of a decision, and the sweep's part:
approvals whose start was lost, and budget notices for the tenant's webhook.

An approval is committed first (store/budgets.py `ask_approval`, by the model call that the
tenant's month refused) and its run started after; the sweep starts any approval whose start
was not marked within the grace (the worker died in between, Temporal was away). Starting is
idempotent: the workflow id is the approval's, a running run is attached to (`USE_EXISTING`)
and a finished one is never run again (`REJECT_DUPLICATE`). A decision's signal is best
effort: the decision is committed, and the run asks the store at its timeout.

A soft threshold crossed leaves a notice row (store/budgets.py `settle`); the sweep delivers
each to the tenant's webhook (`budget`, `soft_threshold`), once per budget and period: the
delivery's id is the notice's, and a notice is marked delivered when the receiver took it.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

from temporalio.client import Client
from temporalio.common import (
    SearchAttributePair,
    TypedSearchAttributes,
    WorkflowIDConflictPolicy,
    WorkflowIDReusePolicy,
)
from temporalio.exceptions import WorkflowAlreadyStartedError

from parley.activities.webhooks import WebhookSender, plan_budget_delivery
from parley.budget_approvals import (
    BUDGET_APPROVAL_WORKFLOW,
    BUDGET_DECIDED_SIGNAL,
    BudgetApprovalInput,
    BudgetDecided,
)
from parley.contracts import SA_TENANT_ID
from parley.store import budgets
from parley.store.db import Database, connect
from parley.webhooks import BUDGET_EVENT

log = logging.getLogger(__name__)

# A run lasts at most this much longer than its wait.
APPROVAL_MARGIN = timedelta(minutes=30)
# A notice's delivery is tried on this many sweeps at most, then left in its log as failed.
NOTICE_ATTEMPTS = 10


async def start_budget_approval(
    client: Client, sessions: Database, approval: budgets.Approval, *, task_queue: str
) -> None:
    """Start the approval's run (once), waiting what is left of its timeout since it was
    asked, then mark its row started."""
    asked_for = (datetime.now(UTC) - approval.created_at).total_seconds()
    left = max(approval.timeout_s - asked_for, 1.0)
    inp = BudgetApprovalInput(
        approval.id, approval.tenant_id, approval.period_start.isoformat(), left
    )
    try:
        await client.start_workflow(
            BUDGET_APPROVAL_WORKFLOW,
            inp,
            id=approval.id,
            task_queue=task_queue,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
            execution_timeout=timedelta(seconds=left) + APPROVAL_MARGIN,
            search_attributes=TypedSearchAttributes(
                [SearchAttributePair(SA_TENANT_ID, approval.tenant_id)]
            ),
            static_summary=(
                f"Budget of tenant {approval.tenant_id} for {approval.period_start:%Y-%m}: "
                "an operator's approval to go over it"
            ),
        )
    except WorkflowAlreadyStartedError:
        pass  # it ran already: the row says how it ended
    async with connect(sessions) as conn:  # one statement, autocommit
        await budgets.mark_approval_started(conn, approval_id=approval.id)


async def tell_budget_approval(client: Client, approval: budgets.Approval) -> None:
    """Tell the run of a committed decision; best effort (see the module)."""
    assert approval.decided_by is not None and approval.decided_at is not None
    decided = BudgetDecided(approval.status, approval.decided_by, approval.decided_at.isoformat())
    try:
        await client.get_workflow_handle(approval.id).signal(BUDGET_DECIDED_SIGNAL, decided)
    except Exception:
        log.warning("could not tell budget approval %s of %s", approval.id, approval.status)


async def sweep_approvals(
    client: Client, sessions: Database, *, task_queue: str, grace: timedelta
) -> int:
    """Start every approval whose start was not marked within `grace`; how many."""
    async with connect(sessions) as db:
        unstarted = await budgets.unstarted_approvals(db, older_than=grace)
    for approval in unstarted:
        log.warning("starting the budget approval %s that nobody started", approval.id)
        await start_budget_approval(client, sessions, approval, task_queue=task_queue)
    return len(unstarted)


async def deliver_notices(sessions: Database, sender: WebhookSender) -> int:
    """Deliver every budget notice not yet delivered to its tenant's webhook (one attempt
    each per sweep); how many the receivers took."""
    async with connect(sessions) as db:
        waiting = await budgets.undelivered_notices(db, max_attempts=NOTICE_ATTEMPTS)
    taken = 0
    for notice in waiting:
        async with sessions() as db:
            planned = await plan_budget_delivery(
                db,
                tenant_id=notice.tenant_id,
                delivery_id=notice.delivery_id,
                payload=notice.payload(BUDGET_EVENT),
            )
            await db.commit()
        if planned is None:
            continue  # the tenant has no webhook (any more)
        delivery, secret = planned
        status = delivery.status
        if status not in ("delivered", "refused"):
            status, _ = await sender.attempt(delivery, secret)
        if status == "delivered":
            async with connect(sessions) as conn:
                await budgets.notice_delivered(conn, notice=notice)
            taken += 1
    return taken
