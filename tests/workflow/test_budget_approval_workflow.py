"""The budget approval workflow alone (workflows/budget_approval.py), on the time-skipping
server, its two steps stubbed under their real names over one approval kept in memory: an
operator's approval or decline ends the wait with who decided and when, a wait nobody answers
times out, a decision whose signal was lost is read at the timeout, and the webhook is asked
once whatever happens.

`PARLEY_RECORD_HISTORY=budget_vN` writes each shape's history to
tests/histories/budget_vN_<shape>.json for the replay tier.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass, field
from typing import Any

from temporalio import activity
from temporalio.client import WorkflowHandle, WorkflowHistory
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from parley.budget_approvals import (
    BUDGET_APPROVAL_WORKFLOW,
    BUDGET_DECIDED_SIGNAL,
    ApprovalStatus,
    BudgetApprovalInput,
    BudgetApprovalOutcome,
    BudgetDecided,
)
from parley.workflows.budget_approval import BudgetApprovalWorkflow
from tests.support.histories import HISTORIES, replayer, scrub

WAIT_S = 3600.0  # skipped by the test server: a timeout takes milliseconds
DECIDED_AT = "2026-12-06T18:00:00+00:00"


@dataclass
class Approval:
    """One approval in memory: its stored status (the route's commit), and the steps run."""

    status: str = ApprovalStatus.waiting
    decided_by: str | None = None
    ran: list[str] = field(default_factory=list)

    def activities(self) -> list[Any]:
        @activity.defn(name="ask_operator")
        async def ask_operator(inp: BudgetApprovalInput) -> str:
            self.ran.append("webhook")
            return "delivered"

        @activity.defn(name="time_out_approval")
        async def time_out_approval(inp: BudgetApprovalInput) -> BudgetApprovalOutcome:
            self.ran.append("time_out")
            if self.status == ApprovalStatus.waiting:
                self.status = ApprovalStatus.timed_out
                return BudgetApprovalOutcome(self.status)
            return BudgetApprovalOutcome(self.status, self.decided_by, DECIDED_AT)

        return [ask_operator, time_out_approval]

    def decide(self, status: str, by: str) -> BudgetDecided:
        """The route: the decision stored, then told to the run."""
        self.status, self.decided_by = status, by
        return BudgetDecided(status, by, DECIDED_AT)


Handle = WorkflowHandle[Any, BudgetApprovalOutcome]


async def _asked(env: WorkflowEnvironment, queue: str) -> Handle:
    approval_id = f"budget-t{uuid.uuid4().hex[:8]}-2026-12"
    return await env.client.start_workflow(
        BUDGET_APPROVAL_WORKFLOW,
        BudgetApprovalInput(approval_id, "tenant", "2026-12-01", WAIT_S),
        id=approval_id,
        task_queue=queue,
        result_type=BudgetApprovalOutcome,
    )


async def _closed(handle: Handle, name: str) -> BudgetApprovalOutcome:
    result = await handle.result()
    history = await handle.fetch_history()
    await replayer(BudgetApprovalWorkflow).replay_workflow(history)
    _record(name, history)
    return result


def _record(name: str, history: WorkflowHistory) -> None:
    recording = os.environ.get("PARLEY_RECORD_HISTORY")
    if recording:
        (HISTORIES / f"{recording}_{name}.json").write_text(scrub(history.to_json()))


def _worker(env: WorkflowEnvironment, approval: Approval, queue: str) -> Worker:
    return Worker(
        env.client,
        task_queue=queue,
        workflows=[BudgetApprovalWorkflow],
        activities=approval.activities(),
    )


async def test_an_approval_ends_the_wait_with_who_decided(env: WorkflowEnvironment) -> None:
    approval, queue = Approval(), f"budget-{uuid.uuid4().hex[:8]}"
    async with _worker(env, approval, queue):
        handle = await _asked(env, queue)
        await handle.signal(BUDGET_DECIDED_SIGNAL, approval.decide("approved", "ops_ana"))
        # Told again (a second operator's click the store refused): the first stands.
        await handle.signal(BUDGET_DECIDED_SIGNAL, BudgetDecided("declined", "ops_bo", DECIDED_AT))
        result = await _closed(handle, "approved")
    assert result == BudgetApprovalOutcome("approved", "ops_ana", DECIDED_AT)
    assert approval.ran == ["webhook"]


async def test_a_decline_ends_the_wait(env: WorkflowEnvironment) -> None:
    approval, queue = Approval(), f"budget-{uuid.uuid4().hex[:8]}"
    async with _worker(env, approval, queue):
        handle = await _asked(env, queue)
        await handle.signal(BUDGET_DECIDED_SIGNAL, approval.decide("declined", "ops_ana"))
        result = await _closed(handle, "declined")
    assert result == BudgetApprovalOutcome("declined", "ops_ana", DECIDED_AT)
    assert approval.ran == ["webhook"]


async def test_a_wait_nobody_answers_times_out(env: WorkflowEnvironment) -> None:
    approval, queue = Approval(), f"budget-{uuid.uuid4().hex[:8]}"
    async with _worker(env, approval, queue):
        handle = await _asked(env, queue)
        result = await _closed(handle, "timed_out")
    assert result == BudgetApprovalOutcome("timed_out")
    assert approval.ran == ["webhook", "time_out"]


async def test_a_decision_whose_signal_was_lost_is_read_at_the_timeout(
    env: WorkflowEnvironment,
) -> None:
    # Stored by the route, its signal never delivered (Temporal away for the API).
    approval, queue = Approval(), f"budget-{uuid.uuid4().hex[:8]}"
    approval.decide("approved", "ops_ana")
    async with _worker(env, approval, queue):
        handle = await _asked(env, queue)
        result = await _closed(handle, "lost_signal")
    assert result == BudgetApprovalOutcome("approved", "ops_ana", DECIDED_AT)
    assert approval.ran == ["webhook", "time_out"]
