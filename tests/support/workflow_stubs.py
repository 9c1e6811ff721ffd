"""Stand-ins for the turn's activities, registered under the real activity names, for the
workflow test tier (tests/workflow/test_workflow.py).

Each stub records the input it was given and answers from a script the test sets; a stub
named in `hold` stays running (heartbeating) until the test releases it or the workflow
cancels it, so a test can act while the turn is at that step.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError

from parley.activities.ending import EndingActivities, Finalized
from parley.activities.heartbeat import heartbeating
from parley.activities.opening import StepOpening
from parley.contracts import (
    TURN_STEERED,
    ActionInput,
    ActionResult,
    BuildContextInput,
    BuildContextResult,
    CallModelInput,
    CallModelResult,
    ExecuteToolInput,
    FailTurnInput,
    FinalizeTurnInput,
    RequestConfirmationInput,
    ScreenInput,
    ScreenResult,
    SummarizeInput,
    SummarizeResult,
    ToolCallRef,
    ToolOutcome,
)
from parley.store.steps import AnswerFacts
from parley.store.summaries import Backlog

# What one model call answers: the tool calls it asks for (none: a plain answer), an error
# to raise, or STEERED (its stream stopped for a steer, store/steering.py).
STEERED = "steered"
ModelAnswer = Sequence[ToolCallRef] | BaseException | str

ACTION_ID = "act_1"

# The `Retry-After` a stubbed provider that is down gives (the real call_model passes it on as
# the failure's next_retry_delay, activities/turn.py). The model call is a local activity, and
# a local activity's retry backoff is waited in real time by the worker, even on the
# time-skipping server: with the policy's own intervals (workflows/options.py MODEL: 0.5 s,
# 1 s, 2 s, 4 s) a test whose primary spends its retries would wait 7.5 s. The attempts are
# still counted and bounded by the policy.
QUICK_RETRY = timedelta(milliseconds=10)


def tool(name: str, args_hash: str, call_id: str | None = None) -> ToolCallRef:
    return ToolCallRef(call_id or f"call_{name}_{args_hash}", name, args_hash)


def unavailable() -> ApplicationError:
    """What the real call_model raises for a provider that is down and says when to come
    back: retryable, soon."""
    return ApplicationError(
        "the provider is unavailable (unavailable)",
        type="unavailable",
        next_retry_delay=QUICK_RETRY,
    )


class Stubs:
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.entered: defaultdict[str, asyncio.Event] = defaultdict(asyncio.Event)
        self.released: defaultdict[str, asyncio.Event] = defaultdict(asyncio.Event)
        self.finished: list[str] = []  # stubs that returned, in order
        self.hold: set[str] = set()
        # Held like `hold`, but a cancellation that reaches it is ignored: the stub finishes
        # with its normal answer once released, as a quick step does that ends before it
        # hears of the cancel.
        self.stubborn: set[str] = set()
        # Errors a stub raises instead of answering, by stub name.
        self.errors: dict[str, BaseException] = {}
        # Model answers in order; once spent, every call answers plainly.
        self.answers: list[ModelAnswer] = []
        # Overrides the script when set (the fallback tests answer by `inp.fallback`).
        self.model: Callable[[CallModelInput], ModelAnswer] | None = None
        self.input_screen = ScreenResult(True)
        self.output_screen = ScreenResult(True)
        self.expired_status = "expired"
        # Provider requests each model call reports (its retries and fallback).
        self.model_attempts = 1
        self.summaries: list[SummarizeInput] = []
        # The reference resolver asks the user to choose: code answers, no model call.
        self.clarification = False
        # Endings refused for a steer newer than the last model call, before one is stored.
        self.steered_endings = 0
        # The newest steer a step's build takes, by step (store/steering.py), and what the
        # input screen says of the steers.
        self.steer_at: dict[int, int] = {}
        self.steer_screen = ScreenResult(True)

    # --- what the test reads ----------------------------------------------------------

    def names(self) -> list[str]:
        return [name for name, _ in self.calls]

    def inputs(self, name: str) -> list[Any]:
        return [inp for called, inp in self.calls if called == name]

    def activities(self) -> list[Callable[..., Any]]:
        # The real tail step, over the stubs of its parts: a test reads the parts it ran.
        ending = EndingActivities(turn=self, screens=self, memory=self)
        # And the real opening step, over the stubs of the build, the screen and the call.
        opening = StepOpening(turn=self, screens=self)
        return [
            opening.open_step,
            ending.finish_turn,
            self.build_context,
            self.call_model,
            self.request_confirmation,
            self.fail_turn,
            self.cancel_turn,
            self.execute_tool,
            self.send_email,
            self.expire_action,
            self.screen_input,
            self.start_summary,
            self.summarize,
        ]

    async def _arrive(self, name: str, inp: Any) -> None:
        self.calls.append((name, inp))
        self.entered[name].set()
        if name in self.hold:
            # Heartbeats carry the workflow's cancellation to the held activity.
            async with heartbeating(interval_s=0.05):
                await self.released[name].wait()
        if name in self.stubborn:
            async with heartbeating(interval_s=0.05):
                try:
                    await self.released[name].wait()
                except asyncio.CancelledError:
                    await self.released[name].wait()  # too late to stop: report success
        self.finished.append(name)  # not reached by a stub cancelled while held
        if name in self.errors:
            raise self.errors[name]

    # --- the stubs, under the real names ------------------------------------------------

    @activity.defn(name="build_context")
    async def build_context(self, inp: BuildContextInput) -> BuildContextResult:
        await self._arrive("build_context", inp)
        steer_seq = self.steer_at.get(inp.step)
        return BuildContextResult(f"mc_{inp.step}", self.clarification, steer_seq)

    @activity.defn(name="call_model")
    async def call_model(self, inp: CallModelInput) -> CallModelResult:
        await self._arrive("call_model", inp)
        if self.model is not None:
            answer = self.model(inp)
        else:
            answer = self.answers.pop(0) if self.answers else []
        if isinstance(answer, BaseException):
            raise answer
        if isinstance(answer, str):
            return CallModelResult(inp.model_call_id, answer, 12, 3, [], self.model_attempts)
        reason = "tool_calls" if answer else "stop"
        return CallModelResult(
            inp.model_call_id, reason, 40, 10, list(answer), attempts=self.model_attempts
        )

    @activity.defn(name="request_confirmation")
    async def request_confirmation(self, inp: RequestConfirmationInput) -> None:
        await self._arrive("request_confirmation", inp)

    async def finalize(self, inp: FinalizeTurnInput, *, backlog: bool = False) -> Finalized:
        """The tail step's ending (it reads no backlog here)."""
        await self._arrive("finalize", inp)
        if self.steered_endings and inp.steerable:
            self.steered_endings -= 1
            raise ApplicationError("steered", type=TURN_STEERED, non_retryable=True)
        return Finalized(f"msg_{inp.model_call_id}")

    @activity.defn(name="fail_turn")
    async def fail_turn(self, inp: FailTurnInput) -> None:
        await self._arrive("fail_turn", inp)

    @activity.defn(name="cancel_turn")
    async def cancel_turn(self, inp: FailTurnInput) -> None:
        await self._arrive("cancel_turn", inp)

    @activity.defn(name="execute_tool")
    async def execute_tool(self, inp: ExecuteToolInput) -> ToolOutcome:
        await self._arrive("execute_tool", inp)
        if inp.refuse:
            return ToolOutcome(inp.call_id, "refused")
        proposal = inp.call_id.startswith("call_propose_email")
        return ToolOutcome(inp.call_id, "ok", ACTION_ID if proposal else None)

    @activity.defn(name="send_email")
    async def send_email(self, inp: ActionInput) -> ActionResult:
        await self._arrive("send_email", inp)
        return ActionResult(inp.action_id, "executed")

    @activity.defn(name="expire_action")
    async def expire_action(self, inp: ActionInput) -> ActionResult:
        await self._arrive("expire_action", inp)
        return ActionResult(inp.action_id, self.expired_status)

    @activity.defn(name="screen_input")
    async def screen_input(self, inp: ScreenInput) -> ScreenResult:
        await self._arrive("screen_input", inp)
        return self.input_screen if inp.steers_after is None else self.steer_screen

    async def answer_facts(self, turn_id: str) -> AnswerFacts | None:
        """No read here: the parts below answer from the script."""
        return None

    async def judge_output(
        self, inp: ScreenInput, facts: AnswerFacts | None = None
    ) -> ScreenResult:
        """The tail step's output screen."""
        await self._arrive("judge_output", inp)
        return self.output_screen

    async def offer_followups(self, inp: ScreenInput, facts: AnswerFacts | None = None) -> None:
        """The tail step's follow-ups."""
        await self._arrive("offer_followups", inp)

    async def start_when_due(self, inp: SummarizeInput, backlog: Backlog | None = None) -> None:
        """The tail step's way in to `start_summary` (the backlog it is handed is not read)."""
        await self.start_summary(inp)

    @activity.defn(name="start_summary")
    async def start_summary(self, inp: SummarizeInput) -> None:
        """Starts nothing here: records that the turn asked for its summary."""
        self.summaries.append(inp)

    @activity.defn(name="summarize")
    async def summarize(self, inp: SummarizeInput) -> SummarizeResult:
        """The summary workflow's step: recorded apart from the turn's own steps (it runs in
        a workflow of its own, after the turn)."""
        self.entered["summarize"].set()
        if "summarize" in self.hold:
            async with heartbeating(interval_s=0.05):
                await self.released["summarize"].wait()
        return SummarizeResult(0)
