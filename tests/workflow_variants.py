"""Deliberately non-deterministic edits of the turn workflow, registered under its real name:
what a careless change looks like. tests/test_replay.py proves that the committed histories
refuse them, so the suite would catch such a change before it reached running turns.
"""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from activities.screens import ScreenActivities
    from activities.turn import TurnActivities
    from parley.contracts import (
        TURN_WORKFLOW,
        BuildContextInput,
        BuildContextResult,
        CallModelResult,
        ScreenInput,
        TurnInput,
    )

from workflows.options import FOLLOWUPS, SCREEN, STORE
from workflows.turn import TurnWorkflow


@workflow.defn(name=TURN_WORKFLOW)
class ExtraStep(TurnWorkflow):
    """Builds the first context twice: one activity more than the histories scheduled."""

    @workflow.run
    async def run(self, inp: TurnInput) -> str:
        return await super().run(inp)

    async def _build_context(self, inp: TurnInput, step: int) -> BuildContextResult:
        if step == 0:
            await STORE.run(TurnActivities.build_context, BuildContextInput(inp.turn_id, step))
        return await super()._build_context(inp, step)


@workflow.defn(name=TURN_WORKFLOW)
class FollowupsFirst(TurnWorkflow):
    """Starts the follow-ups before the output screen: the same activities, two reordered."""

    @workflow.run
    async def run(self, inp: TurnInput) -> str:
        return await super().run(inp)

    async def _screened_answer(self, inp: TurnInput, call: CallModelResult) -> str:
        check = ScreenInput(inp.turn_id, call.model_call_id)
        followups = FOLLOWUPS.start(ScreenActivities.suggest_followups, check)
        screen = SCREEN.start(ScreenActivities.screen_output, check)
        await screen
        await workflow.wait([followups], timeout=1)
        return await self._finalize(inp, call.model_call_id)
