"""Deliberately non-deterministic edits of the turn workflow, registered under its real name:
what a careless change looks like. tests/replay/test_replay.py proves that the committed histories
refuse them, so the suite would catch such a change before it reached running turns.
"""

from __future__ import annotations

from datetime import UTC, datetime

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from parley.activities.screens import ScreenActivities
    from parley.activities.turn import TurnActivities
    from parley.contracts import (
        TURN_WORKFLOW,
        BuildContextInput,
        CallModelInput,
        OpenStepResult,
        ScreenInput,
        TurnInput,
        TurnOutcome,
    )

from parley.workflows.options import MODEL, SCREEN, STORE
from parley.workflows.turn import TurnWorkflow


@workflow.defn(name=TURN_WORKFLOW)
class ExtraStep(TurnWorkflow):
    """Builds the first context once more before opening the step: one activity more than the
    histories scheduled."""

    @workflow.run
    async def run(self, inp: TurnInput) -> TurnOutcome:
        return await super().run(inp)

    async def _open(
        self, inp: TurnInput, *, reanswer_of: str | None = None, screen_input: bool = False
    ) -> OpenStepResult:
        if self._step == 0:
            await STORE.run(TurnActivities.build_context, BuildContextInput(inp.turn_id, 0))
        return await super()._open(inp, reanswer_of=reanswer_of, screen_input=screen_input)


@workflow.defn(name=TURN_WORKFLOW)
class SeparateSteps(TurnWorkflow):
    """Opens every step as build 13 did: the build (beside the input screen, at the first),
    then the call, local steps of their own where the recordings have one."""

    @workflow.run
    async def run(self, inp: TurnInput) -> TurnOutcome:
        return await super().run(inp)

    async def _open(
        self, inp: TurnInput, *, reanswer_of: str | None = None, screen_input: bool = False
    ) -> OpenStepResult:
        screening = (
            SCREEN.run_local(ScreenActivities.screen_input, ScreenInput(inp.turn_id))
            if screen_input
            else None
        )
        built = await STORE.run_local(
            TurnActivities.build_context, BuildContextInput(inp.turn_id, self._step, reanswer_of)
        )
        if screening is not None and not (await screening).allowed:
            return OpenStepResult(built, allowed=False)
        call = await MODEL.run_local(
            TurnActivities.call_model, CallModelInput(inp.turn_id, built.model_call_id)
        )
        return OpenStepResult(built, call=call)


@workflow.defn(name=TURN_WORKFLOW)
class ReadsTheClock(TurnWorkflow):
    """Reads the machine's clock as it starts (instead of `workflow.now()`): the same commands,
    but a replay would see another instant. Only a sandbox refuses it."""

    @workflow.run
    async def run(self, inp: TurnInput) -> TurnOutcome:
        self.started_at = datetime.now(UTC)
        return await super().run(inp)
