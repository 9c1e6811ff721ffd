"""One model step of a turn: the primary model, and the fallback model once the primary's
retries are spent. Workflow code, run inside the turn workflow."""

from __future__ import annotations

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from parley.activities.turn import TurnActivities
    from parley.contracts import CallModelInput, CallModelResult, TurnInput

from parley.workflows.options import MODEL
from parley.workflows.wording import retries_spent, store_unavailable


async def call_model_or_fallback(inp: TurnInput, model_call_id: str, step: int) -> CallModelResult:
    """Call the primary model; when its retries are spent, the fallback (if the turn's input
    says there is one) answers. Each is a local activity of the worker running the turn."""
    try:
        return await MODEL.run_local(
            TurnActivities.call_model,
            CallModelInput(inp.turn_id, model_call_id),
            summary=f"model step {step}",
        )
    except ActivityError as err:
        if not retries_spent(err):
            raise
        if not inp.fallback:
            if store_unavailable(err):
                raise  # the database, not the model: the turn fails with that code
            # Without its cause the turn fails as `model_failed`, the code a turn without a
            # fallback has always ended with (see below).
            raise err from None
        try:
            return await MODEL.run_local(
                TurnActivities.call_model,
                CallModelInput(inp.turn_id, model_call_id, fallback=True),
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
                raise err from None
            raise
