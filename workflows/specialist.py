"""The Returns specialist: a child workflow of the turn that handed it the task.

Deterministic orchestration, ids only in its input and history (the order id, option values
and an action id are the largest things it holds). It asks which item and why, each question
a durable wait on a signal bound to the question's interaction id; checks the return window;
proposes `create_return`, which runs (through `send_email`, under the action's idempotency
key) only after the user's own confirmation, delivered by the same Update/signal as a turn's.

With a real model (`SpecialistPlan.agent`) the steps are the model's own (`_agent`, the loop
of parley/returns_agent.py): each model call and each tool call a durable step, questions the
same interactions and signals, the proposal the same confirmation; the demo model keeps the
fixed steps (`_work`).

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
    from parley.activities.send import SendActivities
    from parley.activities.specialist import SpecialistActivities
    from parley.activities.specialist_agent import SpecialistAgentActivities
    from parley.contracts import (
        ANSWER_INTERACTION_SIGNAL,
        MAX_TOOL_CALLS_PER_RESPONSE,
        RESOLVE_ACTION_UPDATE,
        SPECIALIST_WORKFLOW,
        ActionInput,
        AgentStepInput,
        AgentToolInput,
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
    from parley.returns_agent import ASK_USER, PROPOSE_RETURN
    from parley.specialists import DELEGATE_RETURNS, SpecialistOutcome
    from parley.statuses import ActionStatus, Decision, ToolCallStatus

from parley.workflows.options import MODEL, SEND, STORE, TOOL, to_its_end


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
        said: str | None = None  # the model call whose words end it (a real model's)
        if plan.agent:
            outcome, action_id, said = await self._agent(inp, plan)
        else:
            outcome, action_id = await self._work(inp, plan)
        return await STORE.run(
            SpecialistActivities.end,
            SpecialistEndInput(inp.turn_id, outcome, action_id, inp.name, said),
            summary=f"hand back ({outcome})",
        )

    # --- a real model: the specialist's own agent loop (parley/returns_agent.py) -----------

    async def _agent(
        self, inp: SpecialistInput, plan: SpecialistPlan
    ) -> tuple[str, str | None, str | None]:
        """Model call, its tool calls one at a time, model call again, within
        `plan.max_steps` model calls. A reply in words ends it with those words; a refused
        call (unknown tool, bad arguments) or an empty reply is answered with an error and
        the model asked again; the bound reached ends it `gave_up`."""
        for step in range(plan.max_steps):
            reply = await MODEL.run(
                SpecialistAgentActivities.step,
                AgentStepInput(inp.turn_id, inp.call_id, step),
                summary=f"returns model step {step + 1}",
            )
            if not reply.calls and reply.said:
                return SpecialistOutcome.answered, None, reply.model_call_id
            for call in reply.calls[:MAX_TOOL_CALLS_PER_RESPONSE]:
                if call.refused:
                    continue
                ref = AgentToolInput(
                    inp.turn_id,
                    reply.model_call_id,
                    call.position,
                    plan.order_id,
                    confirmation_timeout_s=plan.confirmation_timeout_s,
                )
                ended = await self._agent_call(plan, ref, call.name)
                if ended is not None:
                    return ended
        return SpecialistOutcome.gave_up, None, None

    async def _agent_call(
        self, plan: SpecialistPlan, ref: AgentToolInput, name: str
    ) -> tuple[str, str | None, str | None] | None:
        """Run one checked call; the specialist's ending when the call ends it (a question
        left unanswered, a proposal the user decided), else None."""
        if name == ASK_USER:
            self._asked += 1
            ref.interaction_id = interaction_id_for(turn_id=ref.turn_id, step=self._asked)
            if not await STORE.run(SpecialistAgentActivities.ask, ref, summary="ask the user"):
                return None
            asked = ref.interaction_id
            try:
                await workflow.wait_condition(
                    lambda: asked in self._answers,
                    timeout=timedelta(seconds=plan.wait_s),
                    timeout_summary=f"answer to {asked}",
                )
            except TimeoutError:
                return SpecialistOutcome.timed_out, None, None
            ref.value = self._answers[asked]
            await STORE.run(SpecialistAgentActivities.answer, ref, summary="take the answer")
            return None
        if name == PROPOSE_RETURN:
            action_id = await STORE.run(
                SpecialistAgentActivities.propose, ref, summary="propose the return"
            )
            if not action_id:
                return None  # refused: the model is told why at its next step
            outcome = await self._confirm_and_create(ref.turn_id, plan, action_id)
            return outcome, action_id, None
        await TOOL.run(SpecialistAgentActivities.run_tool, ref, summary=name)
        return None

    # --- the demo model: fixed steps -------------------------------------------------------

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
        return await self._confirm_and_create(inp.turn_id, plan, action_id), action_id

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

    async def _confirm_and_create(self, turn_id: str, plan: SpecialistPlan, action_id: str) -> str:
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
                ActionInput(turn_id, action_id),
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
                ActionInput(turn_id, action_id),
                summary=f"create return {action_id}",
            )
        )
        if made.status == ActionStatus.executed:
            return SpecialistOutcome.created
        return SpecialistOutcome.failed


def _unanswered(answer: str | None) -> str:
    return SpecialistOutcome.timed_out if answer is None else SpecialistOutcome.gave_up
