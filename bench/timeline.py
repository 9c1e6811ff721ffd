"""(h) Where the first delta's time goes: plain turns, one at a time, each taken apart by stage.

Every stage is read from a record the system keeps anyway, on one machine's clock: the
Temporal history (workflow started, its first workflow task picked up), the trace ledger
(`trace_spans`: the first step running, the context built, the model call running) and the
event log (`turn_events`: the first delta stored), and the client's own clock for the POST and
the first delta it read. A stage's figure is the time from the previous stage, p50 over the
turns; their sum is close to the first delta's p50 (medians do not add exactly). Beside them,
two floors Temporal alone sets on the same server, interleaved with the turns: a no-op
workflow started by a client, to its first regular activity running in another process
(bench/skeleton.py); and a turn's own shape, started eagerly, to its first local step running
on a worker of the client that started it (bench/eager_start.py), as Parley's claiming
worker starts a turn.

The first context build begins beside the workflow's start, on the worker that claimed the
turn (activities/early_build.py), so it may end before the first step runs: "context built"
is then 0, the time it still held the step up; the build's own time and how many turns began
it early are printed below the stages.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from typing import Any

from sqlalchemy import func, select
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from bench.eager_start import first_step, floor_worker
from bench.runner import ParleyTarget, percentile, run_turn, turn_text
from bench.skeleton import first_step_ms
from parley.ids import workflow_id_for_turn
from parley.store.db import Database
from parley.store.models import TraceSpan, TurnEvent
from tests.support.orm import orm

STAGES = (
    "POST -> workflow started",
    "-> first workflow task picked up",
    "-> first step running",
    "-> context built",
    "-> model call running",
    "-> first delta stored",
    "-> first delta at the client",
)
SPANS_WAIT_S = 10.0  # spans may be written after the step that they time


async def measure_timeline(
    parley: ParleyTarget,
    db_sessions: Database,
    temporal: Client,
    *,
    turns: int,
    skeleton_queue: str = "",
) -> dict[str, Any]:
    conversation = await parley.new_conversation()
    samples: list[list[float]] = []
    builds: list[tuple[float, bool]] = []  # the build's own ms, and whether it began early
    floor: list[float] = []
    eager: list[float] = []  # the eager local floor, from the starts the server made eager
    queue = f"eager-floor-{uuid.uuid4().hex[:6]}"
    # The floors' worker runs only when the floors are measured.
    async with floor_worker(temporal, queue) if skeleton_queue else contextlib.nullcontext():
        for i in range(turns):
            if skeleton_queue:  # interleaved with the turns, so all see the same machine
                key = f"{time.time_ns()}-{i}"
                floor.append(await first_step_ms(temporal, skeleton_queue, key))
                seconds, made_eager = await first_step(temporal, queue, "local", True)
                if made_eager:
                    eager.append(seconds * 1000)
            posted_at = time.time()
            turn = await run_turn(parley, conversation, turn_text(i))
            if not turn.ok or turn.first_delta_s is None or parley.last_turn_id is None:
                continue
            found = await _marks(db_sessions, temporal, parley.last_turn_id)
            if found is None:
                continue
            marks, build = found
            builds.append(build)
            marks.append(posted_at + turn.first_delta_s)
            points = [posted_at, *marks]
            samples.append([(b - a) * 1000 for a, b in zip(points, points[1:], strict=False)])
    return {
        "turns": len(samples),
        "stages_p50_ms": {s: percentile([x[k] for x in samples], 0.5) for k, s in enumerate(STAGES)}
        if samples
        else {},
        "skeleton_first_step_p50_ms": percentile(floor, 0.5) if floor else None,
        "eager_local_first_step_p50_ms": percentile(eager, 0.5) if eager else None,
        "build_p50_ms": percentile([ms for ms, _ in builds], 0.5) if builds else None,
        "builds_early": sum(early for _, early in builds),
    }


async def _marks(
    db_sessions: Database, temporal: Client, turn_id: str
) -> tuple[list[float], tuple[float, bool]] | None:
    """The wall-clock instants of the stages after the POST, and the build's own ms and
    whether it began before the first step; None when a record is missing."""
    started = picked = None
    handle = temporal.get_workflow_handle(workflow_id_for_turn(turn_id))
    async for event in handle.fetch_history_events():
        at = event.event_time.ToDatetime().timestamp()
        if event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED:
            started = at
        elif event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED:
            picked = at
            break
    spans = await _spans(db_sessions, turn_id)
    if started is None or picked is None or spans is None:
        return None
    async with orm(db_sessions) as db:
        stored = await db.scalar(
            select(func.min(TurnEvent.created_at)).where(
                TurnEvent.turn_id == turn_id, TurnEvent.type == "delta"
            )
        )
    if stored is None:
        return None
    first_step = min(s.started_at for s in spans if s.name != "build_context")
    build = min((s for s in spans if s.name == "build_context"), key=lambda s: s.started_at)
    context = max(build.ended_at, first_step)  # an early build holds the step up only past it
    model = min(s.started_at for s in spans if s.name == "call_model")
    marks = [started, picked, *(t.timestamp() for t in (first_step, context, model, stored))]
    own_ms = (build.ended_at - build.started_at).total_seconds() * 1000
    return marks, (own_ms, build.started_at < first_step)


async def _spans(db_sessions: Database, turn_id: str) -> list[TraceSpan] | None:
    deadline = time.monotonic() + SPANS_WAIT_S
    while True:
        async with orm(db_sessions) as db:
            spans = list(await db.scalars(select(TraceSpan).where(TraceSpan.turn_id == turn_id)))
        names = {s.name for s in spans}
        if {"build_context", "call_model"} <= names:
            return spans
        if time.monotonic() >= deadline:
            return None
        await asyncio.sleep(0.05)


def render_timeline(results: dict[str, Any]) -> str:
    lines = ["", "(h) The first delta of a plain turn, stage by stage (ms from the previous, p50)"]
    stages = results["stages_p50_ms"]
    for stage in STAGES:
        if stage in stages:
            lines.append(f"  {stage:<38}{stages[stage]:>8.1f}")
    if stages:
        lines.append(f"  {'sum':<38}{sum(stages.values()):>8.1f}   ({results['turns']} turns)")
    build = results.get("build_p50_ms")
    if build is not None:
        lines.append(
            f"  {'the build itself':<38}{build:>8.1f}   (begun beside the start in "
            f"{results['builds_early']} of {results['turns']} turns)"
        )
    floor = results.get("skeleton_first_step_p50_ms")
    if floor is not None:
        lines.append(
            f"  {'floor: start -> no-op first activity':<38}{floor:>8.1f}   "
            "(Temporal alone, bench/skeleton.py)"
        )
    eager = results.get("eager_local_first_step_p50_ms")
    if eager is not None:
        lines.append(
            f"  {'floor: eager start -> first local step':<38}{eager:>8.1f}   "
            "(Temporal alone, a turn's shape: bench/eager_start.py)"
        )
    return "\n".join(lines)
