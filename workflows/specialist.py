"""The Returns specialist: a child workflow of the turn that handed it the task.

Deterministic orchestration, ids only in its input and history (the order id, option values
and an action id are the largest things it holds). It asks which item and why, each question
a durable wait on a signal bound to the question's interaction id; checks the return window;
proposes `create_return`, which runs (through `send_email`, under the action's idempotency
key) only after the user's own confirmation, delivered by the same Update/signal as a turn's.

A question left unanswered for `wait_s` ends the specialist politely; the turn then completes
with those words. Cancelling the turn cancels this workflow with it (a child is cancelled
with its parent's task), and the turn ends `cancelled`.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError, CancelledError, ChildWorkflowError

with workflow.unsafe.imports_passed_through():
    from activities.send import SendActivities
    from activities.specialist import SpecialistActivities
    from parley.contracts import (
        ANSWER_INTERACTION_SIGNAL,
        RESOLVE_ACTION_SIGNAL,
        RESOLVE_ACTION_UPDATE,
        SPECIALIST_WORKFLOW,
        ActionInput,
        AskInput,
        InteractionAnswer,
        ProposeReturnInput,
        ResolveActionSignal,
        SpecialistEndInput,
        SpecialistInput,
        SpecialistPlan,
        ToolCallRef,
        ToolOutcome,
        TurnInput,
    )
    from parley.ids import interaction_id_for, specialist_workflow_id
    from parley.specialists import DELEGATE_RETURNS, SpecialistOutcome
    from parley.statuses import ActionStatus, Decision, ToolCallStatus

from workflows.options import SEND, STORE, TOOL, to_its_end


def delegation(calls: list[ToolCallRef], outcomes: list[ToolOutcome]) -> str | None:
    """The tool call that handed work to a specialist and was accepted, if any."""
    accepted = {o.call_id for o in outcomes if o.status == ToolCallStatus.ok}
    return next(
        (c.call_id for c in calls if c.name == DELEGATE_RETURNS and c.call_id in accepted), None
    )


async def run_specialist(inp: TurnInput, call_id: str) -> str:
    """Run the specialist as a child of the turn; the words the turn ends with. A Stop
    cancels the child with the turn (the turn then ends `cancelled`); a step of the child
    that failed for good fails the turn as the same step of the turn itself would."""
    try:
        return await workflow.execute_child_workflow(
            SpecialistWorkflow.run,
            SpecialistInput(inp.turn_id, call_id),
            id=specialist_workflow_id(turn_id=inp.turn_id),
        )
    except ChildWorkflowError as err:
        if isinstance(err.cause, CancelledError):
            raise asyncio.CancelledError() from err
        if isinstance(err.cause, ActivityError):
            raise err.cause from None
        raise


@workflow.defn(name=SPECIALIST_WORKFLOW)
class SpecialistWorkflow:
    def __init__(self) -> None:
        self._answers: dict[str, str] = {}
        self._decisions: dict[str, str] = {}
        self._awaiting: str | None = None  # the action whose card is shown
        self._asked = 0

    @workflow.signal(name=ANSWER_INTERACTION_SIGNAL)
    def answer(self, answer: InteractionAnswer) -> None:
        """The user's answer to one question (the first delivered wins)."""
        self._answers.setdefault(answer.interaction_id, answer.value)

    @workflow.signal(name=RESOLVE_ACTION_SIGNAL)
    def resolve_action(self, signal: ResolveActionSignal) -> None:
        self._decisions.setdefault(signal.action_id, signal.decision)

    @workflow.update(name=RESOLVE_ACTION_UPDATE)
    def decide_action(self, decision: ResolveActionSignal) -> str:
        """The user's confirm or decline of the proposal (the first delivered wins)."""
        return self._decisions.setdefault(decision.action_id, decision.decision)

    @decide_action.validator
    def _only_the_awaited_decision(self, decision: ResolveActionSignal) -> None:
        if decision.action_id != self._awaiting:
            raise ValueError(f"this specialist is not waiting for {decision.action_id}")
        if decision.decision not in Decision.__members__:
            raise ValueError(f"{decision.decision!r} is not a decision")

    @workflow.run
    async def run(self, inp: SpecialistInput) -> str:
        plan = await STORE.run(SpecialistActivities.begin, inp, summary="hand over to returns")
        outcome, action_id = await self._work(inp, plan)
        return await STORE.run(
            SpecialistActivities.end,
            SpecialistEndInput(inp.turn_id, outcome, action_id, inp.name),
            summary=f"hand back ({outcome})",
        )

    async def _work(self, inp: SpecialistInput, plan: SpecialistPlan) -> tuple[str, str | None]:
        item = await self._ask(inp, plan, "item")
        if not item:
            return _unanswered(item), None
        reason = await self._ask(inp, plan, "reason")
        if not reason:
            return _unanswered(reason), None
        window = await TOOL.run(
            SpecialistActivities.check_window,
            AskInput(inp.turn_id, f"{inp.turn_id}:window", "window", plan.order_id),
            summary="check the return window",
        )
        if not window.eligible:
            return SpecialistOutcome.not_eligible, None
        proposal = ProposeReturnInput(
            inp.turn_id, plan.order_id, item, reason, plan.confirmation_timeout_s
        )
        action_id = await STORE.run(
            SpecialistActivities.propose_return, proposal, summary="propose the return"
        )
        return await self._confirm_and_create(inp, plan, action_id), action_id

    async def _ask(self, inp: SpecialistInput, plan: SpecialistPlan, question: str) -> str | None:
        """The chosen option's value; None when the wait ran out, "" when the step bound
        was reached with no answer that named an option."""
        while self._asked < plan.max_steps:
            self._asked += 1
            asked = interaction_id_for(turn_id=inp.turn_id, step=self._asked)
            await STORE.run(
                SpecialistActivities.ask,
                AskInput(inp.turn_id, asked, question, plan.order_id),
                summary=f"ask the user ({question})",
            )
            try:
                await workflow.wait_condition(
                    lambda: asked in self._answers,  # noqa: B023 (awaited in this iteration)
                    timeout=timedelta(seconds=plan.wait_s),
                    timeout_summary=f"answer to {asked}",
                )
            except TimeoutError:
                return None
            if self._answers[asked]:
                return self._answers[asked]
        return ""

    async def _confirm_and_create(
        self, inp: SpecialistInput, plan: SpecialistPlan, action_id: str
    ) -> str:
        self._awaiting = action_id
        try:
            await workflow.wait_condition(
                lambda: action_id in self._decisions,
                timeout=timedelta(seconds=plan.confirmation_timeout_s),
                timeout_summary=f"confirmation of {action_id} expires",
            )
            decision = self._decisions[action_id]
        except TimeoutError:
            stored = await STORE.run(
                SendActivities.expire_action,
                ActionInput(inp.turn_id, action_id),
                summary=f"expire {action_id}",
            )
            decision = stored.status
        if decision == ActionStatus.expired:
            return SpecialistOutcome.expired
        if decision != Decision.confirmed:
            return SpecialistOutcome.declined
        made = await to_its_end(
            SEND.run(
                SendActivities.send_email,
                ActionInput(inp.turn_id, action_id),
                summary=f"create return {action_id}",
            )
        )
        if made.status == ActionStatus.executed:
            return SpecialistOutcome.created
        return SpecialistOutcome.failed


def _unanswered(answer: str | None) -> str:
    return SpecialistOutcome.timed_out if answer is None else SpecialistOutcome.gave_up
