"""Deliberately non-deterministic edits of the turn workflow, registered under its real name:
what a careless change looks like. tests/replay/test_replay.py proves that the committed histories
refuse them, so the suite would catch such a change before it reached running turns.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator
from datetime import UTC, datetime
from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from parley.activities.turn import TurnActivities
    from parley.contracts import (
        TURN_WORKFLOW,
        BuildContextInput,
        BuildContextResult,
        ScreenResult,
        TurnInput,
        TurnOutcome,
    )

from parley.workflows.options import STORE
from parley.workflows.turn import TurnWorkflow


@workflow.defn(name=TURN_WORKFLOW)
class ExtraStep(TurnWorkflow):
    """Builds the first context twice: one activity more than the histories scheduled."""

    @workflow.run
    async def run(self, inp: TurnInput) -> TurnOutcome:
        return await super().run(inp)

    async def _build_context(
        self, inp: TurnInput, step: int, *, reanswer_of: str | None = None
    ) -> BuildContextResult:
        if step == 0:
            await STORE.run(TurnActivities.build_context, BuildContextInput(inp.turn_id, step))
        return await super()._build_context(inp, step, reanswer_of=reanswer_of)


@workflow.defn(name=TURN_WORKFLOW)
class ScreenAfterContext(TurnWorkflow):
    """Starts the input screen once the first context is built instead of before: the same
    steps, two reordered."""

    @workflow.run
    async def run(self, inp: TurnInput) -> TurnOutcome:
        return await super().run(inp)

    def _screen_input(self, inp: TurnInput) -> Awaitable[ScreenResult]:
        return _StartedWhenAwaited(lambda: super(ScreenAfterContext, self)._screen_input(inp))


class _StartedWhenAwaited:
    """Schedules its step only when awaited. Not a coroutine: the replays that refuse this
    variant fail before it is awaited, and an unawaited coroutine would warn later, when the
    collector finds it, in whichever test of the process is running then."""

    def __init__(self, start: Callable[[], Awaitable[ScreenResult]]) -> None:
        self._start = start

    def __await__(self) -> Generator[Any, None, ScreenResult]:
        return self._start().__await__()


@workflow.defn(name=TURN_WORKFLOW)
class ReadsTheClock(TurnWorkflow):
    """Reads the machine's clock as it starts (instead of `workflow.now()`): the same commands,
    but a replay would see another instant. Only a sandbox refuses it."""

    @workflow.run
    async def run(self, inp: TurnInput) -> TurnOutcome:
        self.started_at = datetime.now(UTC)
        return await super().run(inp)
