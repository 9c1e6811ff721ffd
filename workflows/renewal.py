"""The renewal workflow: the confirmation wait of a card asked for again after it expired.

The turn that proposed the card has ended (`expired`), so it cannot take the answer; one of
these per renewed card (`renewal-act_…`, the renewal's id) stands in for the turn's wait and
reuses its steps (activities/send.py): the user's decision arrives as the same Update the
turn takes (`decide_action`, validated the same way), a confirm runs `send_email` once under
the renewal's idempotency key, and a window that passes runs `expire_action`. No model is
called: the card and the send show on the turn's stream, and the card's status says how it
ended. Only ids travel through history.

Pinned like every workflow of the worker (dispatch/deployment.py); its build 1 recordings are
tests/histories/renewal_v1_*.json (tests/workflow/test_renewal_workflow.py).
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from parley.activities.send import SendActivities
    from parley.approvals import RENEWAL_WORKFLOW, RenewalInput
    from parley.contracts import (
        RESOLVE_ACTION_UPDATE,
        ActionInput,
        ActionResult,
        ResolveActionSignal,
    )
    from parley.statuses import Decision

from parley.workflows.options import SEND, STORE, to_its_end


@workflow.defn(name=RENEWAL_WORKFLOW)
class RenewalWorkflow:
    # The input is known before any handler runs: an answer in the first task is validated
    # against the card it is for.
    @workflow.init
    def __init__(self, inp: RenewalInput) -> None:
        self._action_id = inp.action_id
        self._decision: str | None = None

    @workflow.update(name=RESOLVE_ACTION_UPDATE)
    def decide_action(self, decision: ResolveActionSignal) -> str:
        """The user's decision on the renewed card; the first one delivered wins."""
        if self._decision is None:
            self._decision = decision.decision
        return self._decision

    @decide_action.validator
    def _only_this_card(self, decision: ResolveActionSignal) -> None:
        if decision.action_id != self._action_id:
            raise ValueError(f"this renewal is not waiting for {decision.action_id}")
        if decision.decision not in Decision.__members__:
            raise ValueError(f"{decision.decision!r} is not a decision")

    @workflow.run
    async def run(self, inp: RenewalInput) -> ActionResult:
        card = ActionInput(inp.turn_id, inp.action_id)
        workflow.set_current_details(f"awaiting_confirmation: {inp.action_id}")
        try:
            await workflow.wait_condition(
                lambda: self._decision is not None,
                timeout=timedelta(seconds=inp.wait_s),
                timeout_summary=f"renewed confirmation of {inp.action_id} expires",
            )
            decision = self._decision
        except TimeoutError:
            stored = await STORE.run(
                SendActivities.expire_action, card, summary=f"expire {inp.action_id}"
            )
            decision = stored.status  # "expired", or the answer whose delivery was lost
        if decision != Decision.confirmed:
            return ActionResult(inp.action_id, str(decision))
        workflow.set_current_details(f"executing_action: {inp.action_id}")
        return await to_its_end(
            SEND.run(SendActivities.send_email, card, summary=f"send {inp.action_id}")
        )
