"""A turn's first context build, begun on the ring that starts the turn.

The worker that claims a posted turn (dispatch/outbox.py `start_rung`) begins the build of
its first step at once, beside the workflow's start, instead of after the start, the first
workflow task and the step's own start: the step takes the result from memory (`first`). The
build is the one the step would run (it is idempotent: a second build finds the request the
first stored), so this is only a head start: a build begun here that fails, or a first step
that runs on another worker, builds as it always did. What the build annotates while no step
runs is kept and given to the step's span when it takes the result. A result nobody takes is
dropped after a few seconds (the step ran elsewhere).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from parley.activities import tracing
from parley.activities.context import ContextBuilder
from parley.contracts import BuildContextInput, BuildContextResult

log = logging.getLogger(__name__)


class EarlyBuilds:
    """The first builds begun on a ring, by turn (`begin`), taken by the first step (`first`)."""

    # How long a begun build waits for its step before it is dropped.
    KEEP_S = 10.0

    def __init__(self) -> None:
        self._context: ContextBuilder | None = None
        self._begun: dict[str, asyncio.Task[tuple[BuildContextResult, tracing.Recorded]]] = {}

    def attach(self, context: ContextBuilder) -> None:
        """The builder the turn's steps use (worker.py wires it once)."""
        self._context = context

    def begin(self, turn_id: str) -> None:
        """Begin the turn's first build now (once; nothing without a builder)."""
        if self._context is None or turn_id in self._begun:
            return
        task = asyncio.create_task(self._build(self._context, turn_id))
        task.add_done_callback(_seen)  # a failure is the step's to report, if it takes it
        self._begun[turn_id] = task
        asyncio.get_running_loop().call_later(self.KEEP_S, self._drop, turn_id, task)

    async def first(self, context: ContextBuilder, inp: BuildContextInput) -> BuildContextResult:
        """The step's build: a first step takes the one begun on its ring, if there is one;
        any other step, or one whose early build failed, builds now."""
        begun = self._begun.pop(inp.turn_id, None) if _first_step(inp) else None
        if begun is not None:
            try:
                result, recorded = await begun
            except Exception:
                log.info("the early build of %s failed; building now", inp.turn_id, exc_info=True)
            else:
                recorded.replay()
                return result
        return await context.build(inp)

    async def _build(
        self, context: ContextBuilder, turn_id: str
    ) -> tuple[BuildContextResult, tracing.Recorded]:
        with tracing.recording() as recorded:
            result = await context.build(BuildContextInput(turn_id, 0))
        return result, recorded

    def _drop(self, turn_id: str, task: asyncio.Task[Any]) -> None:
        if self._begun.get(turn_id) is task:
            del self._begun[turn_id]


def _seen(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        task.exception()  # retrieved, so a build nobody took leaves no warning behind


def _first_step(inp: BuildContextInput) -> bool:
    return inp.step == 0 and inp.reanswer_of is None
