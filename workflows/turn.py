"""The turn workflow: one user turn from received to a stored answer.

Deterministic orchestration: every step that touches the world is an activity, and only ids
travel through history (never prompts or tool results), so it does not grow with the chat.

The shape of a turn:

    build context ─▶ call model ─▶ (tool calls?) ─▶ run tools ─▶ build context ─▶ call model …
         │                                        │
         └─ resolver asked the user ─▶ finalize    └─ a proposal ─▶ rest awaiting confirmation
                                                        ─▶ signal / timeout ─▶ send or not …

Bounded by MAX_MODEL_CALLS requests (retries count), MAX_OUTPUT_TOKENS and
MAX_TOOL_CALLS_PER_RESPONSE; a repeated call is refused; the loop keeps its last request for a
re-answer without tools (`_at_the_cap`, parley/paths.py).

Cancel: the API records the Stop on the turn row, then cancels the workflow; every step
boundary checks `workflow.cancellation_reason()` and a step that finds the Stop recorded
refuses to run (`turn_stopped`), so an accepted cancel always ends the turn `cancelled`.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError, CancelledError

with workflow.unsafe.imports_passed_through():
    from activities.memory import MemoryActivities
    from activities.screens import ScreenActivities
    from activities.send import SendActivities
    from activities.tools import ToolActivities
    from activities.turn import TurnActivities
    from parley.contracts import (
        MAX_MODEL_CALLS,
        MAX_OUTPUT_TOKENS,
        MAX_TOOL_CALLS_PER_RESPONSE,
        RESOLVE_ACTION_SIGNAL,
        RESOLVE_ACTION_UPDATE,
        SA_TURN_STATE,
        TERMINAL_TURN_STATES,
        TURN_STOPPED,
        TURN_WORKFLOW,
        ActionInput,
        BuildContextInput,
        BuildContextResult,
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
    from parley.skills import RUN_SKILL
    from parley.statuses import ActionStatus, Decision, TurnErrorCode, turn_error_code
    from parley.tools import Risk, risk_of

from workflows.model_step import call_model_or_fallback
from workflows.options import FOLLOWUPS, SCREEN, SEND, SKILL, STORE, TOOL, to_its_end
from workflows.patches import (
    LIFECYCLE_PATCH,
    LOCAL_FOLLOWUPS_PATCH,
    LOCAL_STORE_PATCH,
    LOCAL_SUMMARY_START_PATCH,
    OPERATOR_STATES_PATCH,
    REANSWER_PATCH,
    SCREENS_PATCH,
    SKILLS_PATCH,
    SPECIALIST_PATCH,
    SUMMARIES_PATCH,
    Patches,
)
from workflows.specialist import delegation, run_specialist
from workflows.wording import (
    BOUNDS_TEXT,
    BUDGET_SPENT,
    EXPIRED_TEXT,
    NOT_SENT_TEXT,
    REQUEST_REFUSED,
    SENT_TEXT,
    TOO_MANY_TOOLS,
)

FOLLOWUPS_GRACE = timedelta(milliseconds=300)
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
        self._lifecycle = False
        self._all_states = True  # every move upserted (turns started before the patch)
        self._shown = TurnState.received  # the search attribute's value
        self._requests = 0  # model requests sent so far, retries and fallback included
        self._model_step = 0  # model calls scheduled so far: "model step 2" in the UI
        self._patches = Patches()  # workflows/patches.py
        self._reanswer = False  # the loop's cap keeps a request back for a re-answer
        self._screening = False
        # How the turn's store steps run: local activities from the patch on (below).
        self._store = STORE.run
        self._screen = SCREEN.run

    @workflow.query
    def state(self) -> str:
        """The turn's current state, as operators see it in the Temporal UI."""
        return self._state

    @workflow.signal(name=RESOLVE_ACTION_SIGNAL)
    def resolve_action(self, signal: ResolveActionSignal) -> None:
        """The user confirmed or declined (or moved on from) a pending action."""
        self._decisions.setdefault(signal.action_id, signal.decision)

    @workflow.update(name=RESOLVE_ACTION_UPDATE)
    def decide_action(self, decision: ResolveActionSignal) -> str:
        """The same decision as an Update: the caller learns that the turn took it. Returns
        the decision the turn holds for the action (the first one delivered wins)."""
        return self._decisions.setdefault(decision.action_id, decision.decision)

    @decide_action.validator
    def _only_the_awaited_decision(self, decision: ResolveActionSignal) -> None:
        """Only the action whose card the turn shows can be decided, with a real decision."""
        if decision.action_id != self._awaiting:
            raise ValueError(f"this turn is not waiting for {decision.action_id}")
        if decision.decision not in Decision.__members__:
            raise ValueError(f"{decision.decision!r} is not a decision")

    def _honour_cancel(self) -> None:
        """A step boundary: a Stop delivered while the step ran is honoured here, whatever
        the step returned (a model call that finished before hearing of it, a screen)."""
        if self._lifecycle and workflow.cancellation_reason() is not None:
            raise asyncio.CancelledError()

    def _budget_spent(self, output_tokens: int) -> bool:
        return self._requests >= MAX_MODEL_CALLS or output_tokens >= MAX_OUTPUT_TOKENS

    def _loop_capped(self, output_tokens: int) -> bool:
        """Whether the tool loop stops before running the calls in hand: one request short of
        the turn's bound when a re-answer will word what the turn found."""
        if self._reanswer and self._requests >= MAX_MODEL_CALLS - 1:
            return True
        return self._budget_spent(output_tokens)

    def _count(self, call: CallModelResult) -> CallModelResult:
        """Count the call's requests: every attempt with the lifecycle rules, else one."""
        self._requests += max(1, call.attempts) if self._lifecycle else 1
        return call

    def _enter(self, state: TurnState, details: str = "") -> None:
        """The turn's state, mirrored for operators: the search attribute, and the current
        details the Temporal UI shows (ids and step numbers only, never personal data)."""
        self._state = state
        if self._all_states or OPERATOR_STATES & {state, self._shown}:
            workflow.upsert_search_attributes([SA_TURN_STATE.value_set(state.value)])
            self._shown = state
        workflow.set_current_details(f"{state.value}: {details}" if details else state.value)

    @workflow.run
    async def run(self, inp: TurnInput) -> str:
        self._patches.start()
        outcome = await self._run(inp)
        if self._patches.taken(SUMMARIES_PATCH):
            # After `done`: started, not awaited, best effort (the next turn's covers a miss).
            run = STORE.run_local if self._patches.taken(LOCAL_SUMMARY_START_PATCH) else STORE.run
            try:
                await run(
                    MemoryActivities.start_summary,
                    SummarizeInput(inp.session_id, inp.turn_id),
                    summary="start the rolling summary",
                )
            except ActivityError:
                workflow.logger.warning("the rolling summary did not start")
        return outcome

    async def _run(self, inp: TurnInput) -> str:
        self._lifecycle = self._patches.taken(LIFECYCLE_PATCH)
        self._all_states = not self._patches.taken(OPERATOR_STATES_PATCH)
        self._reanswer = self._patches.taken(REANSWER_PATCH)
        if self._patches.taken(LOCAL_STORE_PATCH):
            self._store, self._screen = STORE.run_local, SCREEN.run_local
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
                return "stopped"
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
            return "failed"

    async def _end_cancelled(self, inp: TurnInput) -> None:
        """Cancelled (by the user, or abandoned): keep what streamed, marked `cancelled`."""
        await STORE.run(
            TurnActivities.cancel_turn,
            FailTurnInput(inp.turn_id, "cancelled", "the turn was cancelled", True),
            summary="end turn cancelled",
        )
        self._enter(TurnState.cancelled, "stopped; what streamed is kept")

    async def _turn(self, inp: TurnInput) -> str:
        screening = self._screening = self._patches.taken(SCREENS_PATCH)
        input_screen = None
        if screening:
            # Started first, awaited just before the first model call: its latency overlaps
            # context building instead of adding to it (two local activities run at once).
            input_screen = self._screen(
                ScreenActivities.screen_input, ScreenInput(inp.turn_id), summary="screen input"
            )
        self._enter(TurnState.building_context, "context for model step 1")
        step = 0
        context = await self._build_context(inp, step)
        if input_screen is not None:
            verdict = await input_screen  # an error here fails the turn closed
            self._honour_cancel()
            if not verdict.allowed:
                return await self._finalize(inp, context.model_call_id, override=DECLINE_TEXT)
        if context.clarification:
            return await self._finalize(inp, context.model_call_id)
        call = self._count(await self._call_model(inp, context.model_call_id))
        output_tokens = call.output_tokens
        seen: set[tuple[str, str]] = set()
        proposed: list[str] = []  # kept across rounds of tools until the user answers
        while call.tool_calls:
            if self._loop_capped(output_tokens):
                await self._run_tools(inp, call.tool_calls, seen, refuse_all=BUDGET_SPENT)
                return await self._at_the_cap(inp, call, step, output_tokens, seen)
            self._enter(TurnState.executing_tools, ", ".join(c.name for c in call.tool_calls))
            outcomes = await self._run_tools(inp, call.tool_calls, seen)
            handed = delegation(call.tool_calls, outcomes)  # workflows/specialist.py
            if handed is not None and self._patches.taken(SPECIALIST_PATCH):
                said = await run_specialist(inp, handed)
                return await self._finalize(inp, call.model_call_id, override=said)
            proposed += [o.action_id for o in outcomes if o.action_id]
            step += 1
            call = self._count(await self._next_model_call(inp, step))
            output_tokens += call.output_tokens
            if proposed and not call.tool_calls:
                result = await self._confirm_and_execute(inp, proposed[-1], call)
                proposed = []
                if result == "superseded":
                    return await self._finalize(inp, call.model_call_id, outcome="superseded")
                if result == "expired":
                    return await self._finalize(
                        inp, call.model_call_id, outcome="expired", override=EXPIRED_TEXT
                    )
                if self._lifecycle and self._budget_spent(output_tokens):
                    # No request left to word it: code says what happened to the action.
                    said = SENT_TEXT if result == ActionStatus.executed else NOT_SENT_TEXT
                    return await self._finalize(inp, call.model_call_id, override=said)
                step += 1  # the model words what happened to the action
                call = self._count(await self._next_model_call(inp, step))
                output_tokens += call.output_tokens
        if screening:
            return await self._screened_answer(inp, call)
        return await self._finalize(inp, call.model_call_id)

    async def _at_the_cap(
        self,
        inp: TurnInput,
        capped: CallModelResult,
        step: int,
        output_tokens: int,
        seen: set[tuple[str, str]],
    ) -> str:
        """The tool loop hit its cap: a step without tools, the capped step's child, answers
        from what the turn found; with no request left (or no words from it), the bounds
        text does."""
        if not self._reanswer or self._budget_spent(output_tokens):
            return await self._finalize(inp, capped.model_call_id, override=BOUNDS_TEXT)
        context = await self._build_context(inp, step + 1, reanswer_of=capped.model_call_id)
        answer = self._count(await self._call_model(inp, context.model_call_id))
        if answer.tool_calls:  # a provider that asks anyway: refused, every call answered
            await self._run_tools(inp, answer.tool_calls, seen, refuse_all=BUDGET_SPENT)
        if answer.tool_calls or answer.output_chars == 0:
            return await self._finalize(inp, answer.model_call_id, override=BOUNDS_TEXT)
        if self._screening:
            return await self._screened_answer(inp, answer)
        return await self._finalize(inp, answer.model_call_id)

    async def _screened_answer(self, inp: TurnInput, call: CallModelResult) -> str:
        """The output screen and the follow-ups run side by side once the answer is complete;
        a declined answer is retracted, an erroring screen lets the answer stand."""
        check = ScreenInput(inp.turn_id, call.model_call_id)
        screen = self._screen(ScreenActivities.screen_output, check, summary="screen answer")
        offer = (
            FOLLOWUPS.run_local if self._patches.taken(LOCAL_FOLLOWUPS_PATCH) else FOLLOWUPS.start
        )
        followups = offer(ScreenActivities.suggest_followups, check, summary="suggest follow-ups")
        try:
            verdict = await screen
        except ActivityError:
            verdict = ScreenResult(True, "screen_error")  # fail open; the activity logged it
        if self._lifecycle and workflow.cancellation_reason() is not None:
            followups.cancel()  # a cancelled screen is no verdict: the Stop is honoured
        self._honour_cancel()
        if not verdict.allowed:
            followups.cancel()
            return await self._finalize(
                inp, call.model_call_id, override=RETRACTION_TEXT, retract=True
            )
        # Follow-ups are a courtesy: a moment's head start, never a wait for `done`.
        await workflow.wait([followups], timeout=FOLLOWUPS_GRACE.total_seconds())
        return await self._finalize(inp, call.model_call_id)

    async def _build_context(
        self, inp: TurnInput, step: int, *, reanswer_of: str | None = None
    ) -> BuildContextResult:
        what = " (re-answer, no tools)" if reanswer_of else ""
        built = await self._store(
            TurnActivities.build_context,
            BuildContextInput(inp.turn_id, step, reanswer_of),
            summary=f"context for model step {self._model_step + 1}{what}",
        )
        self._honour_cancel()
        return built

    async def _call_model(self, inp: TurnInput, model_call_id: str) -> CallModelResult:
        self._model_step += 1
        self._enter(TurnState.calling_model, f"model step {self._model_step}")
        answered = await call_model_or_fallback(inp, model_call_id, self._model_step, self._patches)
        # A call that finished before it heard of the Stop does not swallow it.
        self._honour_cancel()
        return answered

    async def _next_model_call(self, inp: TurnInput, step: int) -> CallModelResult:
        context = await self._build_context(inp, step)
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
        self._honour_cancel()
        message_id = await self._store(
            TurnActivities.finalize_turn,
            FinalizeTurnInput(inp.turn_id, model_call_id, outcome, override, retract),
            summary=f"finalize ({outcome}{', retracted' if retract else ''})",
        )
        ended = TurnState.expired if outcome == "expired" else TurnState.completed
        self._enter(ended, f"answered with message {message_id}")
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
        jobs: list[tuple[ExecuteToolInput, str]] = []  # each with its line in the UI
        for position, call in enumerate(calls):
            refuse = refuse_all
            key = (call.name, call.args_hash)
            if refuse is None and key in seen:
                refuse = "an identical call already ran in this turn; use its result"
            if refuse is None and self._lifecycle and position >= MAX_TOOL_CALLS_PER_RESPONSE:
                refuse = TOO_MANY_TOOLS
            seen.add(key)
            jobs.append(
                (
                    ExecuteToolInput(inp.turn_id, call.call_id, refuse, inp.confirmation_timeout_s),
                    f"{call.name} (refused)" if refuse else call.name,
                )
            )
        skill_call = any(c.name == RUN_SKILL for c in calls)
        skills_serial = skill_call and self._patches.taken(SKILLS_PATCH)
        parallel = [
            (j, summary)
            for (j, summary), c in zip(jobs, calls, strict=True)
            if (risk_of(c.name) in (Risk.read, None) or j.refuse)
            and not (skills_serial and c.name == RUN_SKILL)
        ]
        serial = [j for j in jobs if j not in parallel]
        outcomes = list(await asyncio.gather(*(self._execute_tool(*j) for j in parallel)))
        for one in serial:
            self._honour_cancel()
            outcomes.append(await self._execute_tool(*one))
        self._honour_cancel()
        return outcomes

    async def _execute_tool(self, job: ExecuteToolInput, summary: str) -> ToolOutcome:
        # A skill's sandbox may run for its whole wall clock: a bundle of its own.
        options = SKILL if summary == RUN_SKILL else TOOL
        return await options.run(ToolActivities.execute_tool, job, summary=summary)

    async def _confirm_and_execute(
        self, inp: TurnInput, action_id: str, call: CallModelResult
    ) -> str:
        """Show the card, wait for the user's own answer, then send (or not). Returns the
        action's final status, or "superseded"."""
        self._awaiting = action_id
        await self._store(
            TurnActivities.request_confirmation,
            RequestConfirmationInput(inp.turn_id, action_id, call.model_call_id),
            summary=f"show the card for {action_id}",
        )
        self._honour_cancel()
        wait_s = inp.confirmation_timeout_s
        self._enter(TurnState.awaiting_confirmation, f"{action_id}, expires after {wait_s:g} s")
        try:
            await workflow.wait_condition(
                lambda: action_id in self._decisions,
                timeout=timedelta(seconds=wait_s),
                timeout_summary=f"confirmation of {action_id} expires",
            )
            decision = self._decisions[action_id]
        except TimeoutError:
            stored = await self._store(
                SendActivities.expire_action,
                ActionInput(inp.turn_id, action_id),
                summary=f"expire {action_id}",
            )
            decision = stored.status  # "expired", or the answer whose signal was lost
        if decision in ("superseded", "expired", "declined"):
            return decision
        self._honour_cancel()  # no send starts after the Stop
        self._enter(TurnState.executing_action, f"sending email {action_id}")
        sent = await to_its_end(
            SEND.run(
                SendActivities.send_email,
                ActionInput(inp.turn_id, action_id),
                summary=f"send email {action_id}",
            )
        )
        return sent.status
