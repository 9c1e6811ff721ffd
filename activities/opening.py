"""A model step opened in one local step (turn build 14): the context built, beside the input
screen for a turn's first step, then the model called, with no trip back to the workflow in
between.

Build 13 ran these as three local steps (`screen_input` and `build_context` side by side,
then `call_model`); each step costs the worker its activity machinery and the turn a hop
through the workflow before the model is asked. The parts are unchanged, and so is what the
workflow decides from them: a declined message, or declined steers, end the turn with the
decline text; code that asks the user (the resolver's clarification) ends it with that
question; otherwise the step's answer comes back as the model call's result.

Retries: the step runs under the model call's retry policy (workflows/options.py `MODEL`).
A retried attempt finds the request its build already packed (activities/context.py) and the
model call resets what it had streamed, as they did as steps of their own. The input screen
is retried here, briefly, as its own step was; when it keeps failing the step fails for good
(non-retryable): a turn whose message could not be screened ends failed, never answered by a
fallback model. A cancel heard while the build or the screen runs ends the step before the
model is asked; a Stop recorded on the turn stops the call itself (`turn_stopped`).

A turn's first build may have begun before the step, beside the workflow's start, on the
worker that claimed the turn (activities/early_build.py): the step then awaits that build's
result instead of building, and records its span as its own part.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

from temporalio import activity
from temporalio.exceptions import ApplicationError

from parley.activities import tracing
from parley.activities.early_build import EarlyBuilds
from parley.contracts import (
    BuildContextInput,
    BuildContextResult,
    CallModelInput,
    CallModelResult,
    OpenStepInput,
    OpenStepResult,
    ScreenInput,
    ScreenResult,
)

# The input screen's tries within one attempt of the step, and the pause before each retry
# (build 13's screen step: three attempts, the first retry after 200 ms).
SCREEN_TRIES = 3
SCREEN_RETRY_S = 0.2
# The failure type of a step whose input screen kept failing (the client sees `model_failed`).
SCREEN_FAILED = "input_screen_failed"


class StepParts(Protocol):
    """The step's parts: the context build and the model call (activities/turn.py)."""

    async def build_context(self, inp: BuildContextInput) -> BuildContextResult: ...

    async def call_model(self, inp: CallModelInput) -> CallModelResult: ...


class InputScreen(Protocol):
    """The input screen (activities/screens.py)."""

    async def screen_input(self, inp: ScreenInput) -> ScreenResult: ...


class StepOpening:
    def __init__(
        self, *, turn: StepParts, screens: InputScreen, early: EarlyBuilds | None = None
    ) -> None:
        self._turn = turn
        self._screens = screens
        self._early = early

    @activity.defn(name="open_step")
    async def open_step(self, inp: OpenStepInput) -> OpenStepResult:
        screening = (
            asyncio.ensure_future(self._screen(ScreenInput(inp.turn_id)))
            if inp.screen_input
            else None
        )
        try:
            built = await self._build(BuildContextInput(inp.turn_id, inp.step, inp.reanswer_of))
            verdict = None if screening is None else await screening
        finally:
            if screening is not None and not screening.done():
                screening.cancel()
            elif screening is not None and not screening.cancelled():
                screening.exception()  # read: when the build failed, its error is the step's
        if verdict is not None and not verdict.allowed:
            return OpenStepResult(built, allowed=False)
        if (built.steer_seq or 0) > inp.steers_screened:
            steers = await self._screen(ScreenInput(inp.turn_id, steers_after=inp.steers_screened))
            if not steers.allowed:
                return OpenStepResult(built, steer_declined=True)
        if built.clarification:
            return OpenStepResult(built)
        if activity.in_activity() and activity.is_cancelled():
            # Heard while a part ran that finished anyway: no model is asked after a Stop.
            raise asyncio.CancelledError()
        with tracing.part("call_model"):
            call = await self._turn.call_model(CallModelInput(inp.turn_id, built.model_call_id))
        return OpenStepResult(built, call=call)

    async def _build(self, inp: BuildContextInput) -> BuildContextResult:
        """The step's build: the one begun early for it on this worker, when there is one
        and it succeeded; otherwise built here."""
        begun = self._early.take(inp) if self._early is not None else None
        if begun is not None:
            built = await begun.result()
            if built is not None:
                return built
        with tracing.part("build_context"):
            return await self._turn.build_context(inp)

    async def _screen(self, inp: ScreenInput) -> ScreenResult:
        """The input screen, tried SCREEN_TRIES times; then the step fails closed."""
        failed: Exception | None = None
        for tried in range(1, SCREEN_TRIES + 1):
            try:
                with tracing.part("screen_input"):
                    return await self._screens.screen_input(inp)
            except Exception as err:  # a screen's own error: retried, then failed closed
                if isinstance(err, ApplicationError) and err.non_retryable:
                    raise
                failed = err
            if tried < SCREEN_TRIES:
                await asyncio.sleep(SCREEN_RETRY_S * tried)
        raise ApplicationError(
            "the input screen could not check the message", type=SCREEN_FAILED, non_retryable=True
        ) from failed
