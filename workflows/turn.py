"""The turn workflow: one user turn from received to a stored answer.

Deterministic orchestration only. Every step that touches the world is an activity; the
workflow passes ids (turn, model call, tool call, action), never prompts, transcripts or
tool results, so its history stays the same size at turn 30 as at turn 1.

The shape of a turn:

    build context ─▶ call model ─▶ (tool calls?) ─▶ run tools ─▶ build context ─▶ call model …
         │                                        │
         └─ resolver asked the user ─▶ finalize    └─ a proposal ─▶ rest awaiting confirmation
                                                        ─▶ signal / timeout ─▶ send or not …

Bounded: at most MAX_MODEL_CALLS model calls and MAX_OUTPUT_TOKENS output tokens per turn;
an identical repeated tool call is refused rather than run again.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError, CancelledError

with workflow.unsafe.imports_passed_through():
    from activities.memory import MemoryActivities
    from activities.screens import ScreenActivities
    from activities.tools import ToolActivities
    from activities.turn import TurnActivities
    from parley.contracts import (
        MAX_MODEL_CALLS,
        MAX_OUTPUT_TOKENS,
        RESOLVE_ACTION_SIGNAL,
        SA_TURN_STATE,
        TURN_WORKFLOW,
        ActionInput,
        BuildContextInput,
        BuildContextResult,
        CallModelInput,
        CallModelResult,
        ExecuteToolInput,
        FailTurnInput,
        FinalizeTurnInput,
        RequestConfirmationInput,
        ResolveActionSignal,
        ScreenInput,
        ScreenResult,
        SummarizeInput,
        ToolCallRef,
        ToolOutcome,
        TurnInput,
        TurnState,
    )
    from parley.screens import DECLINE_TEXT, RETRACTION_TEXT
    from parley.tools import Risk, risk_of

from workflows.options import FOLLOWUPS, MODEL, SCREEN, SEND, STORE, TOOL

# Turns started before screens existed replay without them.
SCREENS_PATCH = "screens-v1"
# Turns started before the input said whether a fallback model exists replay the old way:
# schedule the fallback and learn from its error that there is none.
FALLBACK_PATCH = "fallback-from-input"
FOLLOWUPS_GRACE = timedelta(milliseconds=300)
# Turns started before rolling summaries existed replay without starting one.
SUMMARIES_PATCH = "summaries-v1"

# Provider answers that a retry of the same request would get again.
REQUEST_REFUSED = frozenset(
    {"bad_request", "unauthorized", "forbidden", "not_found", "too_large", "unprocessable"}
)

BOUNDS_TEXT = (
    "I've reached the limit of steps I can take for one answer, so I'll stop here. "
    "Please ask again, a little more specifically."
)
EXPIRED_TEXT = "The confirmation expired, so I did not send the email."


@workflow.defn(name=TURN_WORKFLOW)
class TurnWorkflow:
    def __init__(self) -> None:
        self._state = TurnState.received
        self._decisions: dict[str, str] = {}

    @workflow.query
    def state(self) -> str:
        """The turn's current state, as operators see it in the Temporal UI."""
        return self._state

    @workflow.signal(name=RESOLVE_ACTION_SIGNAL)
    def resolve_action(self, signal: ResolveActionSignal) -> None:
        """The user confirmed or declined (or moved on from) a pending action."""
        self._decisions.setdefault(signal.action_id, signal.decision)

    def _enter(self, state: TurnState) -> None:
        self._state = state
        workflow.upsert_search_attributes([SA_TURN_STATE.value_set(state.value)])

    @workflow.run
    async def run(self, inp: TurnInput) -> str:
        outcome = await self._run(inp)
        if workflow.patched(SUMMARIES_PATCH):
            # After the answer is stored (`done` has gone out): the summary workflow is
            # started on its own and not awaited, so it never delays a turn. Best effort: a
            # summary that fails to start is covered by the next turn's.
            try:
                await STORE.run(
                    MemoryActivities.start_summary, SummarizeInput(inp.session_id, inp.turn_id)
                )
            except ActivityError:
                workflow.logger.warning("the rolling summary did not start")
        return outcome

    async def _run(self, inp: TurnInput) -> str:
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
            code = "model_failed"
            if isinstance(cause, ApplicationError) and cause.type:
                code = cause.type
            await STORE.run(
                TurnActivities.fail_turn,
                FailTurnInput(
                    inp.turn_id,
                    code,
                    "the assistant could not finish this answer",
                    # Whether asking again may help: not when the request itself was refused.
                    code not in REQUEST_REFUSED,
                ),
            )
            self._enter(TurnState.failed)
            return "failed"

    async def _end_cancelled(self, inp: TurnInput) -> None:
        """Cancelled (by the user, or abandoned): keep what streamed, marked `cancelled`."""
        await STORE.run(
            TurnActivities.cancel_turn,
            FailTurnInput(inp.turn_id, "cancelled", "the turn was cancelled", True),
        )
        self._enter(TurnState.cancelled)

    async def _turn(self, inp: TurnInput) -> str:
        # Turns started before screens existed replay without them.
        screening = workflow.patched(SCREENS_PATCH)
        input_screen = None
        if screening:
            # Started first, awaited just before the first model call: its latency overlaps
            # context building instead of adding to it.
            input_screen = SCREEN.start(ScreenActivities.screen_input, ScreenInput(inp.turn_id))
        self._enter(TurnState.building_context)
        step = 0
        context = await self._build_context(inp, step)
        if input_screen is not None:
            verdict = await input_screen  # an error here fails the turn closed
            if not verdict.allowed:
                return await self._finalize(inp, context.model_call_id, override=DECLINE_TEXT)
        if context.clarification:
            return await self._finalize(inp, context.model_call_id)
        self._enter(TurnState.calling_model)
        call = await self._call_model(inp, context.model_call_id)
        model_calls, output_tokens = 1, call.output_tokens
        seen: set[tuple[str, str]] = set()
        proposed: list[str] = []  # kept across rounds of tools until the user answers
        while call.tool_calls:
            if model_calls >= MAX_MODEL_CALLS or output_tokens >= MAX_OUTPUT_TOKENS:
                await self._run_tools(inp, call.tool_calls, seen, refuse_all="turn budget spent")
                return await self._finalize(inp, call.model_call_id, override=BOUNDS_TEXT)
            self._enter(TurnState.executing_tools)
            outcomes = await self._run_tools(inp, call.tool_calls, seen)
            proposed += [o.action_id for o in outcomes if o.action_id]
            step += 1
            call = await self._next_model_call(inp, step)
            model_calls, output_tokens = model_calls + 1, output_tokens + call.output_tokens
            if proposed and not call.tool_calls:
                result = await self._confirm_and_execute(inp, proposed[-1], call)
                proposed = []
                if result == "superseded":
                    return await self._finalize(inp, call.model_call_id, outcome="superseded")
                if result == "expired":
                    return await self._finalize(
                        inp, call.model_call_id, outcome="expired", override=EXPIRED_TEXT
                    )
                step += 1  # the model words what happened to the action
                call = await self._next_model_call(inp, step)
                model_calls, output_tokens = model_calls + 1, output_tokens + call.output_tokens
        if screening:
            return await self._screened_answer(inp, call)
        return await self._finalize(inp, call.model_call_id)

    async def _screened_answer(self, inp: TurnInput, call: CallModelResult) -> str:
        """The output screen and the follow-ups run side by side once the answer is complete;
        a declined answer is retracted, an erroring screen lets the answer stand."""
        check = ScreenInput(inp.turn_id, call.model_call_id)
        screen = SCREEN.start(ScreenActivities.screen_output, check)
        followups = FOLLOWUPS.start(ScreenActivities.suggest_followups, check)
        try:
            verdict = await screen
        except ActivityError:
            verdict = ScreenResult(True, "screen_error")  # fail open; the activity logged it
        if not verdict.allowed:
            followups.cancel()
            return await self._finalize(
                inp, call.model_call_id, override=RETRACTION_TEXT, retract=True
            )
        # Follow-ups are a courtesy: a moment's head start, never a wait for `done`.
        await workflow.wait([followups], timeout=FOLLOWUPS_GRACE.total_seconds())
        return await self._finalize(inp, call.model_call_id)

    async def _build_context(self, inp: TurnInput, step: int) -> BuildContextResult:
        return await STORE.run(TurnActivities.build_context, BuildContextInput(inp.turn_id, step))

    async def _call_model(self, inp: TurnInput, model_call_id: str) -> CallModelResult:
        try:
            return await MODEL.run(
                TurnActivities.call_model, CallModelInput(inp.turn_id, model_call_id)
            )
        except ActivityError as err:
            if not _retries_spent(err):
                raise
            # The primary's retries are spent: the fallback model (if configured) answers.
            if workflow.patched(FALLBACK_PATCH) and not inp.fallback:
                # Without its cause the turn fails as `model_failed`, the code a turn
                # without a fallback has always ended with (see below).
                raise err from None
            try:
                return await MODEL.run(
                    TurnActivities.call_model,
                    CallModelInput(inp.turn_id, model_call_id, fallback=True),
                )
            except ActivityError as fallback_err:
                # The worker has no fallback though the turn's starter thought it had (or
                # the turn predates the input's field): the primary's error stands, its cause
                # dropped so that the turn fails as `model_failed`.
                no_fallback = isinstance(fallback_err.cause, ApplicationError) and (
                    fallback_err.cause.type == "no_fallback"
                )
                if no_fallback:
                    raise err from None
                raise

    async def _next_model_call(self, inp: TurnInput, step: int) -> CallModelResult:
        context = await self._build_context(inp, step)
        self._enter(TurnState.calling_model)
        return await self._call_model(inp, context.model_call_id)

    async def _finalize(
        self,
        inp: TurnInput,
        model_call_id: str,
        *,
        outcome: str = "completed",
        override: str | None = None,
        retract: bool = False,
    ) -> str:
        message_id = await STORE.run(
            TurnActivities.finalize_turn,
            FinalizeTurnInput(inp.turn_id, model_call_id, outcome, override, retract),
        )
        self._enter(TurnState.expired if outcome == "expired" else TurnState.completed)
        workflow.set_current_details(f"answered with message {message_id}")
        return message_id

    async def _run_tools(
        self,
        inp: TurnInput,
        calls: list[ToolCallRef],
        seen: set[tuple[str, str]],
        *,
        refuse_all: str | None = None,
    ) -> list[ToolOutcome]:
        """Reads run in parallel; proposals and hand-offs one at a time, after them."""
        jobs: list[ExecuteToolInput] = []
        for call in calls:
            refuse = refuse_all
            key = (call.name, call.args_hash)
            if refuse is None and key in seen:
                refuse = "an identical call already ran in this turn; use its result"
            seen.add(key)
            jobs.append(
                ExecuteToolInput(inp.turn_id, call.call_id, refuse, inp.confirmation_timeout_s)
            )
        parallel = [
            j
            for j, c in zip(jobs, calls, strict=True)
            if risk_of(c.name) in (Risk.read, None) or j.refuse
        ]
        serial = [j for j in jobs if j not in parallel]
        outcomes = list(await asyncio.gather(*(self._execute_tool(j) for j in parallel)))
        for job in serial:
            outcomes.append(await self._execute_tool(job))
        return outcomes

    async def _execute_tool(self, job: ExecuteToolInput) -> ToolOutcome:
        return await TOOL.run(ToolActivities.execute_tool, job)

    async def _confirm_and_execute(
        self, inp: TurnInput, action_id: str, call: CallModelResult
    ) -> str:
        """Show the card, wait for the user's own answer, then send (or not). Returns the
        action's final status, or "superseded"."""
        await STORE.run(
            TurnActivities.request_confirmation,
            RequestConfirmationInput(inp.turn_id, action_id, call.model_call_id),
        )
        self._enter(TurnState.awaiting_confirmation)
        try:
            await workflow.wait_condition(
                lambda: action_id in self._decisions,
                timeout=timedelta(seconds=inp.confirmation_timeout_s),
            )
            decision = self._decisions[action_id]
        except TimeoutError:
            stored = await STORE.run(
                ToolActivities.expire_action, ActionInput(inp.turn_id, action_id)
            )
            decision = stored.status  # "expired", or the answer whose signal was lost
        if decision in ("superseded", "expired", "declined"):
            return decision
        self._enter(TurnState.executing_action)
        send = asyncio.ensure_future(
            SEND.run(ToolActivities.send_email, ActionInput(inp.turn_id, action_id))
        )
        try:
            sent = await asyncio.shield(send)
        except asyncio.CancelledError:
            # A send under way is finished and recorded before the turn ends cancelled, so
            # what happened to the email is never lost.
            await send
            raise
        return sent.status


def _retries_spent(err: ActivityError) -> bool:
    """The primary failed for good after its retries, rather than refusing the request or
    being cancelled (which a fallback model would not change)."""
    cause = err.cause
    if isinstance(cause, CancelledError):
        return False
    return not isinstance(cause, ApplicationError) or not cause.non_retryable
