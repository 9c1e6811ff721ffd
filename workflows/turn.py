"""The turn workflow: one user turn from received to a stored answer.

Deterministic orchestration: every step that touches the world is an activity, and only ids
travel through history (never prompts or tool results), so it does not grow with the chat.

A plain answer is one workflow task of two local activities of the worker running the turn:
the opening step (`open_step`, build 14: the context build beside the input screen, then the
model call, activities/opening.py) and the tail (`finish_turn`: output screen, follow-ups,
ending, summary start). A dead worker is noticed at the workflow
task's timeout (5 s, dispatch/outbox.py; the SDK extends the task while a long local step
runs), and the next worker runs the step again (a model call resets what it had streamed).
Tools, the confirmed send, the confirmation wait and the endings by failure or Stop stay
regular activities and timers: an operator sees them pending, and an ending is scheduled once
even when the task that asked for it is refused (a Stop or a tool's result arriving in it).
A new shape is a new build, never a branch in this code: each turn is pinned to the build it
started on (dispatch/deployment.py).

The shape of a turn:

    build context ─▶ call model ─▶ (tool calls?) ─▶ run tools ─▶ build context ─▶ call model …
         │                                        │
         └─ resolver asked the user ─▶ finalize    └─ a proposal ─▶ rest awaiting confirmation
                                                        ─▶ decision / timeout ─▶ send or not …

Bounded by MAX_MODEL_CALLS requests (retries count), MAX_OUTPUT_TOKENS and
MAX_TOOL_CALLS_PER_RESPONSE; a repeated call is refused; the loop keeps its last request for a
re-answer without tools (`_at_the_cap`, parley/paths.py).

Build 14 opens every model step in one local step where build 13 ran the build (beside the
input screen) and the call as steps of their own: the same decisions, one hop and two
activities fewer before the first token. Turns pinned to build 13 run build 13's code.

Steer (build 13): a message sent with `"mode": "steer"` reaches a running step through the
store's doorbell (store/steering.py): a stream stops (`steered`) and the next step takes it;
a tool batch ends first; an ending it holds back (`turn_steered`) answers it first; a card's
wait, which the Update `steer` wakes, keeps the card while a step without tools answers it.
A turn that is not steered runs the commands of build 12.

Cancel: the API records the Stop on the turn row, then cancels the workflow; every step
boundary checks `workflow.cancellation_reason()` and a step that finds the Stop recorded
refuses to run (`turn_stopped`), so an accepted cancel always ends the turn `cancelled`. A
model call watches the row while it streams (activities/stop_watch.py): a local step hears
of the workflow's cancel only at the next workflow task.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError, CancelledError

with workflow.unsafe.imports_passed_through():
    from parley.activities.ending import EndingActivities
    from parley.activities.memory import MemoryActivities
    from parley.activities.send import SendActivities
    from parley.activities.turn import TurnActivities
    from parley.contracts import (
        MAX_MODEL_CALLS,
        MAX_OUTPUT_TOKENS,
        RESOLVE_ACTION_SIGNAL,
        RESOLVE_ACTION_UPDATE,
        SA_TURN_STATE,
        STEER_UPDATE,
        TERMINAL_TURN_STATES,
        TURN_STEERED,
        TURN_STOPPED,
        TURN_WORKFLOW,
        ActionInput,
        CallModelResult,
        FailTurnInput,
        FinalizeTurnInput,
        FinishTurnInput,
        OpenStepInput,
        OpenStepResult,
        RequestConfirmationInput,
        ResolveActionSignal,
        SteerInput,
        SummarizeInput,
        TurnInput,
        TurnOutcome,
        TurnState,
    )
    from parley.screens import DECLINE_TEXT
    from parley.statuses import (
        ActionStatus,
        Decision,
        FinishReason,
        TurnErrorCode,
        turn_error_code,
    )

from parley.workflows.model_step import open_step
from parley.workflows.options import SEND, STORE, to_its_end
from parley.workflows.specialist import delegation, run_specialist
from parley.workflows.steering import EndingSteered, SteerDeclined, Steers
from parley.workflows.tool_batch import honour_cancel, run_tools
from parley.workflows.wording import (
    BOUNDS_TEXT,
    BUDGET_SPENT,
    EXPIRED_TEXT,
    NOT_SENT_TEXT,
    REQUEST_REFUSED,
    SENT_TEXT,
)

OPERATOR_STATES = TERMINAL_TURN_STATES | {TurnState.awaiting_confirmation}


# Pinned under Worker Deployment Versioning (a turn ends on the build it started on) by the
# versioned worker's default (dispatch/deployment.py); an unversioned worker may not declare it.
@workflow.defn(name=TURN_WORKFLOW)
class TurnWorkflow:
    def __init__(self) -> None:
        self._state = TurnState.received
        self._decisions: dict[str, str] = {}
        # The action whose card the turn shows: the only one an Update may decide.
        self._awaiting: str | None = None
        self._shown = TurnState.received  # the search attribute's value
        self._requests = 0  # model requests sent so far, retries and fallback included
        self._model_step = 0  # model calls scheduled so far: "model step 2" in the UI
        self._summary_started = False  # by the tail step
        self._step = 0  # the turn's model step being built: a steer adds one
        self._output_tokens = 0
        self._seen: set[tuple[str, str]] = set()  # tool calls run, for the repeat guard
        self._steers = Steers()

    @workflow.query
    def state(self) -> str:
        """The turn's current state, as operators see it in the Temporal UI."""
        return self._state

    # The API delivers every decision as the Update below; build 12's turns took them by
    # signal, and a workflow-tier test still races one against a Stop (the order of the two
    # in history is what it checks). Dropping it is not a change of shape: no command.
    @workflow.signal(name=RESOLVE_ACTION_SIGNAL)
    def resolve_action(self, signal: ResolveActionSignal) -> None:
        """The user confirmed or declined (or moved on from) a pending action."""
        self._decisions.setdefault(signal.action_id, signal.decision)

    @workflow.update(name=RESOLVE_ACTION_UPDATE)
    def decide_action(self, decision: ResolveActionSignal) -> str:
        """The user's decision, as the API delivers it: the caller learns that the turn took
        it. Returns the decision the turn holds for the action (the first one delivered wins)."""
        return self._decisions.setdefault(decision.action_id, decision.decision)

    @decide_action.validator
    def _only_the_awaited_decision(self, decision: ResolveActionSignal) -> None:
        """Only the action whose card the turn shows can be decided, with a real decision."""
        if decision.action_id != self._awaiting:
            raise ValueError(f"this turn is not waiting for {decision.action_id}")
        if decision.decision not in Decision.__members__:
            raise ValueError(f"{decision.decision!r} is not a decision")

    @workflow.update(name=STEER_UPDATE)
    def steer(self, steer: SteerInput) -> int:
        """A message the user sent with `"mode": "steer"` (workflows/steering.py)."""
        return self._steers.deliver(steer)

    @steer.validator
    def _only_while_running(self, steer: SteerInput) -> None:
        """An ended turn takes no steer (the message then stays a message of the session)."""
        if self._state in TERMINAL_TURN_STATES:
            raise ValueError(f"this turn has ended ({self._state})")

    def _budget_spent(self, output_tokens: int) -> bool:
        return self._requests >= MAX_MODEL_CALLS or output_tokens >= MAX_OUTPUT_TOKENS

    def _loop_capped(self, output_tokens: int) -> bool:
        """Whether the tool loop stops before running the calls in hand: one request short of
        the turn's bound when a re-answer will word what the turn found."""
        if self._requests >= MAX_MODEL_CALLS - 1:
            return True
        return self._budget_spent(output_tokens)

    def _count(self, call: CallModelResult) -> CallModelResult:
        """Count the call's requests: every attempt, retries and the fallback included."""
        self._requests += max(1, call.attempts)
        return call

    def _enter(self, state: TurnState, details: str = "") -> None:
        """The turn's state, mirrored for operators: the search attribute, and the current
        details the Temporal UI shows (ids and step numbers only, never personal data). The
        attribute moves only into and out of the states an operator looks a turn up by
        (resting on a card, ended): set at the start, one upsert when the turn ends or waits."""
        self._state = state
        if OPERATOR_STATES & {state, self._shown}:
            workflow.upsert_search_attributes([SA_TURN_STATE.value_set(state.value)])
            self._shown = state
        workflow.set_current_details(f"{state.value}: {details}" if details else state.value)

    @workflow.run
    async def run(self, inp: TurnInput) -> TurnOutcome:
        outcome = await self._run(inp)
        if not self._summary_started:
            # After `done`: started, not awaited, best effort (the next turn's covers a miss).
            try:
                await STORE.run_local(
                    MemoryActivities.start_summary,
                    SummarizeInput(inp.session_id, inp.turn_id, local=True),
                    summary="start the rolling summary",
                )
            except ActivityError:
                workflow.logger.warning("the rolling summary did not start")
        return outcome

    async def _run(self, inp: TurnInput) -> TurnOutcome:
        try:
            return await self._turn(inp)
        except asyncio.CancelledError:
            await self._end_cancelled(inp)
            raise
        except ActivityError as err:
            cause = err.cause
            if isinstance(cause, CancelledError):
                await self._end_cancelled(inp)
                raise asyncio.CancelledError() from err
            if isinstance(cause, ApplicationError) and cause.type == TURN_STOPPED:
                # A step found the turn ended, or its Stop recorded: end it as the user asked
                # (a no-op if it already ended), and stop.
                await self._end_cancelled(inp)
                if workflow.cancellation_reason() is not None:
                    raise asyncio.CancelledError() from err
                return TurnOutcome("stopped")
            code = TurnErrorCode.model_failed
            if isinstance(cause, ApplicationError) and cause.type:
                code = turn_error_code(cause.type)
            await STORE.run(
                TurnActivities.fail_turn,
                FailTurnInput(
                    inp.turn_id,
                    code,
                    "the assistant could not finish this answer",
                    # Whether asking again may help: not when the request itself was refused.
                    code not in REQUEST_REFUSED,
                ),
                summary=f"fail turn ({code})",
            )
            self._enter(TurnState.failed, f"ended with {code}")
            return TurnOutcome("failed")

    async def _end_cancelled(self, inp: TurnInput) -> None:
        """Cancelled (by the user, or abandoned): keep what streamed, marked `cancelled`."""
        await STORE.run(
            TurnActivities.cancel_turn,
            FailTurnInput(inp.turn_id, "cancelled", "the turn was cancelled", True),
            summary="end turn cancelled",
        )
        self._enter(TurnState.cancelled, "stopped; what streamed is kept")

    async def _turn(self, inp: TurnInput) -> TurnOutcome:
        try:
            return await self._answered(inp)
        except SteerDeclined as declined:  # the input screen's decline, as for the message
            return await self._finalize(
                inp, declined.model_call_id, override=DECLINE_TEXT, steerable=False
            )

    async def _answered(self, inp: TurnInput) -> TurnOutcome:
        # One local step: the input screen beside the context build, then the model call
        # (activities/opening.py). A screen that keeps failing fails the turn closed.
        opened = await self._open(inp, screen_input=True)
        if not opened.allowed:
            return await self._finalize(
                inp, opened.built.model_call_id, override=DECLINE_TEXT, steerable=False
            )
        if opened.call is None:  # code asks: its ending is not held back by a steer
            return await self._finalize(inp, opened.built.model_call_id, steerable=False)
        call = await self._until_answered(inp, opened.call)
        while True:
            try:
                return await self._answer(inp, call)
            except EndingSteered:
                # A steer came after the last model call: the model answers it as well.
                call = await self._next_model_call(inp)

    async def _answer(self, inp: TurnInput, call: CallModelResult) -> TurnOutcome:
        """From a model call to the turn's ending: the tool loop, a card and its decision,
        the answer. `EndingSteered` when the ending found a steer newer than the last call."""
        seen = self._seen
        proposed: list[str] = []  # kept across rounds of tools until the user answers
        while call.tool_calls:
            if self._loop_capped(self._output_tokens):
                await run_tools(inp, call.tool_calls, seen, refuse_all=BUDGET_SPENT)
                return await self._at_the_cap(inp, call)
            self._enter(TurnState.executing_tools, ", ".join(c.name for c in call.tool_calls))
            outcomes = await run_tools(inp, call.tool_calls, seen)
            handed = delegation(call.tool_calls, outcomes)  # workflows/specialist.py
            if handed is not None:
                said = await run_specialist(inp, handed)
                return await self._finalize(inp, call.model_call_id, override=said)
            proposed += [o.action_id for o in outcomes if o.action_id]
            call = await self._next_model_call(inp)
            if proposed and not call.tool_calls:
                result = await self._confirm_and_execute(inp, proposed[-1], call)
                proposed = []
                if result == "superseded":
                    return await self._finalize(inp, call.model_call_id, outcome="superseded")
                if result == "expired":
                    return await self._finalize(
                        inp, call.model_call_id, outcome="expired", override=EXPIRED_TEXT
                    )
                if self._budget_spent(self._output_tokens):
                    # No request left to word it: code says what happened to the action.
                    said = SENT_TEXT if result == ActionStatus.executed else NOT_SENT_TEXT
                    return await self._finalize(
                        inp, call.model_call_id, override=said, steerable=False
                    )
                # The model words what happened to the action.
                call = await self._next_model_call(inp)
        return await self._screened_answer(inp, call)

    async def _at_the_cap(self, inp: TurnInput, capped: CallModelResult) -> TurnOutcome:
        """The tool loop hit its cap: a step without tools, the capped step's child, answers
        from what the turn found; with no request left (or no words from it), the bounds
        text does."""
        if self._budget_spent(self._output_tokens):
            return await self._finalize(
                inp, capped.model_call_id, override=BOUNDS_TEXT, steerable=False
            )
        answer = await self._next_call(inp, reanswer_of=capped.model_call_id)
        answer = await self._until_answered(inp, answer)
        if answer.tool_calls:  # a provider that asks anyway: refused, every call answered
            await run_tools(inp, answer.tool_calls, self._seen, refuse_all=BUDGET_SPENT)
        if answer.tool_calls or answer.output_chars == 0:
            return await self._finalize(
                inp, answer.model_call_id, override=BOUNDS_TEXT, steerable=False
            )
        return await self._screened_answer(inp, answer)

    async def _screened_answer(self, inp: TurnInput, call: CallModelResult) -> TurnOutcome:
        """The output screen and the follow-ups run side by side once the answer is complete,
        both parts of the tail step (activities/ending.py): a declined answer is retracted, an
        erroring screen lets the answer stand."""
        if call.finish_reason == FinishReason.steered:
            # Stopped for a steer with no request left to answer it: its partial text is
            # superseded, never the answer.
            return await self._finalize(
                inp, call.model_call_id, override=BOUNDS_TEXT, steerable=False
            )
        return await self._finalize(inp, call.model_call_id, screen=True)

    async def _open(
        self, inp: TurnInput, *, reanswer_of: str | None = None, screen_input: bool = False
    ) -> OpenStepResult:
        """Step `self._step`, opened in one local step: its context built (beside the input
        screen, `screen_input`), the steers it took screened, then its model called; the call
        counted. `SteerDeclined` when the screen declines the steers."""
        self._model_step += 1
        what = " (re-answer, no tools)" if reanswer_of else ""
        self._enter(TurnState.calling_model, f"model step {self._model_step}{what}")
        opening = OpenStepInput(
            inp.turn_id, self._step, reanswer_of, screen_input, self._steers.screened
        )
        opened = await open_step(inp, opening, self._model_step, self._steers)
        # A step that finished before it heard of the Stop does not swallow it.
        honour_cancel()
        self._steers.took(opened.built.steer_seq)
        if opened.steer_declined:
            raise SteerDeclined(opened.built.model_call_id)
        if opened.call is not None:
            self._count(opened.call)
            self._output_tokens += opened.call.output_tokens
        return opened

    async def _next_call(
        self, inp: TurnInput, *, reanswer_of: str | None = None
    ) -> CallModelResult:
        """The turn's next step and its model's answer (code answers only a turn's first)."""
        self._step += 1
        opened = await self._open(inp, reanswer_of=reanswer_of)
        if opened.call is None:
            raise ApplicationError("a later step was answered by code", non_retryable=True)
        return opened.call

    async def _until_answered(self, inp: TurnInput, answered: CallModelResult) -> CallModelResult:
        """A call stopped for a steer is followed by the next step (its build takes the steer)
        while the turn has requests left."""
        while answered.finish_reason == FinishReason.steered:
            if self._budget_spent(self._output_tokens):
                break
            answered = await self._next_call(inp)
        return answered

    async def _next_model_call(self, inp: TurnInput) -> CallModelResult:
        return await self._until_answered(inp, await self._next_call(inp))

    async def _finalize(
        self,
        inp: TurnInput,
        model_call_id: str,
        *,
        outcome: str = "completed",
        override: str | None = None,
        screen: bool = False,
        steerable: bool = True,
    ) -> TurnOutcome:
        """Store the ending in one step that also screens a model's answer (`screen`), offers
        its follow-ups and starts the rolling summary when due. `EndingSteered` when a steer
        newer than the turn's last model call holds it back (`steerable`, while requests are
        left: a turn at its bounds ends with what it has)."""
        honour_cancel()
        steerable = steerable and not self._budget_spent(self._output_tokens)
        ending = FinalizeTurnInput(
            inp.turn_id, model_call_id, outcome, override, steerable=steerable
        )
        try:
            message_id = await STORE.run_local(
                EndingActivities.finish_turn,
                FinishTurnInput(ending, inp.session_id, screen),
                summary=f"finish ({outcome}{', screened' if screen else ''})",
            )
        except ActivityError as err:
            cause = err.cause
            if isinstance(cause, ApplicationError) and cause.type == TURN_STEERED:
                raise EndingSteered() from err
            raise
        self._summary_started = True
        ended = TurnState.expired if outcome == "expired" else TurnState.completed
        self._enter(ended, f"answered with message {message_id}")
        return TurnOutcome(outcome, message_id or None)

    async def _decided(self, action_id: str, wait: timedelta) -> bool:
        """Wait for the user's decision on the card (True) or a steer it has not taken
        (False); TimeoutError when the card's time is up."""
        if wait <= timedelta(0):
            raise TimeoutError
        await workflow.wait_condition(
            lambda: action_id in self._decisions or self._steers.waiting,
            timeout=wait,
            timeout_summary=f"confirmation of {action_id} expires",
        )
        return action_id in self._decisions

    async def _answer_on_the_card(
        self, inp: TurnInput, action_id: str, card: CallModelResult
    ) -> CallModelResult:
        """A steer while the card waits: a step without tools (the card's child) answers it,
        and the turn rests on the same card again, with that answer above it."""
        if self._budget_spent(self._output_tokens):
            self._steers.take_all()  # no request left: the card still waits
            return card
        answer = await self._next_call(inp, reanswer_of=card.model_call_id)
        answer = await self._until_answered(inp, answer)
        self._steers.take_all()  # answered (a retried build reports no steer it took)
        await STORE.run_local(
            TurnActivities.request_confirmation,
            RequestConfirmationInput(inp.turn_id, action_id, answer.model_call_id),
            summary=f"show the card for {action_id} again",
        )
        honour_cancel()
        self._enter(TurnState.awaiting_confirmation, f"{action_id}, after a steer")
        return answer

    async def _confirm_and_execute(
        self, inp: TurnInput, action_id: str, call: CallModelResult
    ) -> str:
        """Show the card, wait for the user's own answer, then send (or not). Returns the
        action's final status, or "superseded"."""
        self._awaiting = action_id
        await STORE.run_local(
            TurnActivities.request_confirmation,
            RequestConfirmationInput(inp.turn_id, action_id, call.model_call_id),
            summary=f"show the card for {action_id}",
        )
        honour_cancel()
        wait_s = inp.confirmation_timeout_s
        self._enter(TurnState.awaiting_confirmation, f"{action_id}, expires after {wait_s:g} s")
        wait, expires = timedelta(seconds=wait_s), workflow.now() + timedelta(seconds=wait_s)
        try:
            # A steer while the card waits is answered, the card kept, within the same wait.
            while not await self._decided(action_id, wait):
                call = await self._answer_on_the_card(inp, action_id, call)
                wait = expires - workflow.now()
            decision = self._decisions[action_id]
        except TimeoutError:
            stored = await STORE.run_local(
                SendActivities.expire_action,
                ActionInput(inp.turn_id, action_id),
                summary=f"expire {action_id}",
            )
            decision = stored.status  # "expired", or the answer whose delivery was lost
        if decision in ("superseded", "expired", "declined"):
            return decision
        honour_cancel()  # no send starts after the Stop
        self._enter(TurnState.executing_action, f"sending email {action_id}")
        sent = await to_its_end(
            SEND.run(
                SendActivities.send_email,
                ActionInput(inp.turn_id, action_id),
                summary=f"send email {action_id}",
            )
        )
        return sent.status
