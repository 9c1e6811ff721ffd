"""A turn's first context build, begun by the worker that claims its start, while Temporal
starts the workflow; the turn's opening step takes the result from memory.

The start of a posted turn (dispatch/outbox.py `start_rung`) waits on Temporal for a few
milliseconds (the start call, then the first workflow task and its local step) with the
worker idle; the build is the opening step's first part and needs nothing from the workflow,
so the claiming worker begins it beside the start. The eager start hands the first workflow
task to this same worker, whose opening step (activities/opening.py) then finds the build
done or under way, and awaits it instead of building.

Only a shortcut, like the input screen's handover (activities/handover.py): the build is the
same one, idempotent, and it stores its result. A step that finds nothing begun here (the
task went to another worker, the start failed, the build failed or this is a retry) builds
for itself, which finds the request already packed when the early build stored it: a read,
not a second build. A result nobody takes is dropped after `KEEP_S`. At most `AT_ONCE`
builds run early at a time, whatever the rings: the worker's pool holds connections for them
beside one per activity slot (worker.py `worker_pool`), so that a burst of posts never makes
the steps wait for a connection; a turn rung past that builds in its step, as before.

The early build moves the turn to `building_context` before its workflow may have started;
the outbox sweep starts an unstarted turn in either state (store/outbox.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from parley.activities import tracing
from parley.contracts import BuildContextInput, BuildContextResult

log = logging.getLogger(__name__)

Build = Callable[[BuildContextInput], Awaitable[BuildContextResult]]


@dataclass
class Begun:
    """An early build: its task, and its span (`tracing.Detached`) until a step adopts it."""

    task: asyncio.Task[BuildContextResult]
    record: tracing.Detached = field(default_factory=tracing.Detached)

    async def result(self) -> BuildContextResult | None:
        """The build's result once it is done, or None when it failed (the step then builds
        for itself, and meets the same error with its own retries). Its span becomes a part
        of the running step, as if the step had built."""
        try:
            built: BuildContextResult | None = await asyncio.shield(self.task)
        except asyncio.CancelledError:
            if not self.task.cancelled():
                raise  # the step itself was cancelled: the build goes on, and is stored
            built = None
        except Exception:
            built = None
        tracing.adopt("build_context", self.record)
        return built


class EarlyBuilds:
    """The first builds this worker began for the turns it claimed, by turn."""

    # How long a begun build waits for its turn's step before it is dropped (stored anyway).
    KEEP_S = 30.0
    # Builds begun early that may run at once, and the pooled connections each may hold (the
    # build's reads, its writes, the knowledge search beside them).
    AT_ONCE = 4
    CONNECTIONS_EACH = 3

    def __init__(self) -> None:
        self._build: Build | None = None
        self._begun: dict[str, Begun] = {}
        self._running = 0

    def attach(self, build: Build) -> None:
        """The worker's context build (activities/context.py); none attached, none begun."""
        self._build = build

    def begin(self, turn_id: str) -> asyncio.Task[BuildContextResult] | None:
        """Begin the turn's first build now, beside its start; its task, or None when none
        was begun."""
        if self._build is None or turn_id in self._begun or self._running >= self.AT_ONCE:
            return None
        record = tracing.Detached()
        task = asyncio.create_task(self._run(self._build, turn_id, record))
        self._running += 1
        task.add_done_callback(self._ended)
        begun = self._begun[turn_id] = Begun(task, record)
        asyncio.get_running_loop().call_later(self.KEEP_S, self._drop, turn_id, begun)
        return task

    def take(self, inp: BuildContextInput) -> Begun | None:
        """The early build of this step, once: a turn's first step only (a later step, or
        a re-answer, builds from what the steps before it did)."""
        if inp.step != 0 or inp.reanswer_of is not None:
            return None
        return self._begun.pop(inp.turn_id, None)

    @staticmethod
    async def _run(build: Build, turn_id: str, record: tracing.Detached) -> BuildContextResult:
        with tracing.detached(record):
            return await build(BuildContextInput(turn_id))

    def _drop(self, turn_id: str, begun: Begun) -> None:
        if self._begun.get(turn_id) is begun:
            del self._begun[turn_id]

    def _ended(self, task: asyncio.Task[BuildContextResult]) -> None:
        """One early build fewer; its failure is read here (its step builds again and
        reports its own)."""
        self._running -= 1
        if not task.cancelled() and task.exception() is not None:
            log.info(
                "an early context build failed; its step builds for itself: %r", task.exception()
            )
