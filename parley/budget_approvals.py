"""A tenant's monthly budget exhausted: an operator decides whether its turns go on.

The first turn of a month that the tenant's monthly budget refuses (`budget_exhausted`,
activities/budgets.py) asks once for the month: it commits an approval row (store/budgets.py,
the row is the start outbox) and starts its workflow (`budget-<tenant>-<YYYY-MM>` in the
Temporal UI, searchable by `ParleyTenantId`; workflows/budget_approval.py). The run tells the
tenant's webhook (a `budget` event, parley/webhooks.py) and waits for the operator's
decision (`POST /v1/admin/tenants/{t}/budget/approval`) as long as the tenant's
`budgets.approval_timeout_s` says:

    waiting ──approve──> approved    turns go on for the rest of the month (under the new
       │                             ceiling if one was given, else with none)
       ├────decline───> declined     turns stay refused until the month ends
       └────timeout───> timed_out    the same

The store holds the decision (who, when, the ceiling); the budget check reads it there, in
the reservation's own statement. The route commits a decision, then tells the run by
signal; a signal that is lost costs the run's history a delay, never the decision: at its
timeout the run asks the store, which keeps a decision made before it. Every later refusal
of the month finds the row and asks nothing again.
"""

# (No `from __future__ import annotations`: the run's payloads are decoded in the sandbox
# with their annotations as evaluated here; dispatch/runner.py.)
from dataclasses import dataclass
from datetime import date
from enum import StrEnum

BUDGET_APPROVAL_WORKFLOW = "BudgetApprovalWorkflow"
BUDGET_DECIDED_SIGNAL = "budget_decided"
# How long an operator has to decide when the tenant sets no `approval_timeout_s`.
DEFAULT_APPROVAL_TIMEOUT_S = 24 * 3600.0


class ApprovalStatus(StrEnum):
    waiting = "waiting"
    approved = "approved"
    declined = "declined"
    timed_out = "timed_out"


class Decision(StrEnum):
    """What an operator answers."""

    approve = "approve"
    decline = "decline"


def decided_status(decision: Decision) -> ApprovalStatus:
    return ApprovalStatus.approved if decision == Decision.approve else ApprovalStatus.declined


def approval_id(*, tenant_id: str, period_start: date) -> str:
    """The approval's id and its workflow's: one per tenant and month."""
    return f"budget-{tenant_id}-{period_start:%Y-%m}"


@dataclass
class BudgetApprovalInput:
    """The run's input: ids and the wait, never an amount or a conversation."""

    approval_id: str
    tenant_id: str
    period_start: str  # ISO date, the month's first day
    timeout_s: float


@dataclass
class BudgetDecided:
    """The signal: the stored decision, as the route committed it."""

    status: str  # approved | declined
    decided_by: str
    decided_at: str  # ISO timestamp


@dataclass
class BudgetApprovalOutcome:
    """The run's result: how the approval ended, who decided and when (none on a timeout)."""

    status: str
    decided_by: str | None = None
    decided_at: str | None = None
