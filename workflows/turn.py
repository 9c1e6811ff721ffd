"""The turn workflow: one user turn from received to a stored answer.

Deterministic orchestration only. Every step that touches the world is an activity; the
workflow passes ids (turn, model call), never prompts or transcripts, so its history stays
the same size at turn 30 as at turn 1.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from activities.turn import TurnActivities
    from parley.contracts import (
        SA_TURN_STATE,
        TURN_WORKFLOW,
        BuildContextInput,
        CallModelInput,
        FailTurnInput,
        FinalizeTurnInput,
        TurnInput,
        TurnState,
    )

# Store writes are short; retry them patiently, a database restart should not fail a turn.
STORE_TIMEOUT = timedelta(seconds=30)
STORE_RETRY = RetryPolicy(
    initial_interval=timedelta(milliseconds=200),
    maximum_interval=timedelta(seconds=5),
    maximum_attempts=20,
)

# The model call streams for a while; a short heartbeat timeout notices a dead worker fast.
MODEL_RETRY = RetryPolicy(
    initial_interval=timedelta(milliseconds=500),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=10),
    maximum_attempts=5,
)


@workflow.defn(name=TURN_WORKFLOW)
class TurnWorkflow:
    def __init__(self) -> None:
        self._state = TurnState.received

    @workflow.query
    def state(self) -> str:
        """The turn's current state, as operators see it in the Temporal UI."""
        return self._state

    def _enter(self, state: TurnState) -> None:
        self._state = state
        workflow.upsert_search_attributes([SA_TURN_STATE.value_set(state.value)])

    @workflow.run
    async def run(self, inp: TurnInput) -> str:
        try:
            self._enter(TurnState.building_context)
            context = await workflow.execute_activity_method(
                TurnActivities.build_context,
                BuildContextInput(inp.turn_id),
                start_to_close_timeout=STORE_TIMEOUT,
                retry_policy=STORE_RETRY,
            )
            self._enter(TurnState.calling_model)
            call = await workflow.execute_activity_method(
                TurnActivities.call_model,
                CallModelInput(inp.turn_id, context.model_call_id),
                start_to_close_timeout=timedelta(minutes=5),
                heartbeat_timeout=timedelta(seconds=5),
                retry_policy=MODEL_RETRY,
            )
            message_id = await workflow.execute_activity_method(
                TurnActivities.finalize_turn,
                FinalizeTurnInput(inp.turn_id, call.model_call_id),
                start_to_close_timeout=STORE_TIMEOUT,
                retry_policy=STORE_RETRY,
            )
        except ActivityError as err:
            cause = err.cause
            code = "model_failed"
            if isinstance(cause, ApplicationError) and cause.type:
                code = cause.type
            await workflow.execute_activity_method(
                TurnActivities.fail_turn,
                FailTurnInput(
                    inp.turn_id, code, "the assistant could not finish this answer", True
                ),
                start_to_close_timeout=STORE_TIMEOUT,
                retry_policy=STORE_RETRY,
            )
            self._enter(TurnState.failed)
            return "failed"
        self._enter(TurnState.completed)
        workflow.set_current_details(f"answered with message {message_id}")
        return message_id
