"""One model step of a turn: opened in one local step (its context built, beside the input
screen for the turn's first, then the primary model called: activities/opening.py), and,
once the primary's retries are spent, answered by the fallback model. Workflow code, run
inside the turn workflow."""

from __future__ import annotations

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from parley.activities.opening import StepOpening
    from parley.activities.screens import ScreenActivities
    from parley.activities.turn import TurnActivities
    from parley.contracts import (
        BuildContextInput,
        CallModelInput,
        OpenStepInput,
        OpenStepResult,
        ScreenInput,
        TurnInput,
    )

from parley.workflows.options import MODEL, SCREEN, STORE
from parley.workflows.steering import Steers, screened
from parley.workflows.wording import retries_spent, store_unavailable


async def open_step(
    inp: TurnInput, opening: OpenStepInput, step: int, steers: Steers
) -> OpenStepResult:
    """Open the step with the primary model; when its retries are spent, the fallback (if the
    turn's input says there is one) answers. Each is a local activity of the worker running
    the turn. `SteerDeclined` when the fallback's step finds steers the screen declines."""
    try:
        return await MODEL.run_local(StepOpening.open_step, opening, summary=f"model step {step}")
    except ActivityError as err:
        if not retries_spent(err):
            raise
        if not inp.fallback:
            if store_unavailable(err):
                raise  # the database, not the model: the turn fails with that code
            # Without its cause the turn fails as `model_failed`, the code a turn without a
            # fallback has always ended with (see below).
            raise err from None
        return await _fallback(inp, opening, step, steers, err)


async def _fallback(
    inp: TurnInput, opening: OpenStepInput, step: int, steers: Steers, primary: ActivityError
) -> OpenStepResult:
    """The step's parts one by one (rare: the primary failed for good): the build finds the
    request its attempts packed, the input screen and the steers' checks run again (whatever
    failed in the primary's attempts, no model sees an unscreened message), then the fallback
    model answers."""
    built = await STORE.run_local(
        TurnActivities.build_context,
        BuildContextInput(inp.turn_id, opening.step, opening.reanswer_of),
        summary=f"context for model step {step} (fallback model)",
    )
    if opening.screen_input:
        verdict = await SCREEN.run_local(
            ScreenActivities.screen_input, ScreenInput(inp.turn_id), summary="screen input"
        )
        if not verdict.allowed:
            return OpenStepResult(built, allowed=False)
    await screened(inp, built, steers)
    if built.clarification:
        return OpenStepResult(built)
    try:
        call = await MODEL.run_local(
            TurnActivities.call_model,
            CallModelInput(inp.turn_id, built.model_call_id, fallback=True),
            summary=f"model step {step} (fallback model)",
        )
    except ActivityError as fallback_err:
        # The worker has no fallback though the turn's starter thought it had (or the
        # turn predates the input's field): the primary's error stands, its cause dropped
        # so that the turn fails as `model_failed`.
        no_fallback = isinstance(fallback_err.cause, ApplicationError) and (
            fallback_err.cause.type == "no_fallback"
        )
        if no_fallback:
            raise primary from None
        raise
    return OpenStepResult(built, call=call)
