"""The floor Temporal itself sets: a skeleton workflow of no-op activities, same dev server.

A Parley turn is a workflow of a handful of activities; this measures how many workflows of
that shape per second the same Temporal dev server and a worker like Parley's can run on this
machine when the activities do nothing at all, once as regular activities (each a trip
through the task queue) and once as local activities (run inside the workflow task's
worker, recorded as markers). Parley's turns/s is read against the regular row with the
same number of activities, and against the one-activity row (issue 25's yardstick).

The new shape of a plain turn (issue 25: start, one workflow task, done) has its own floor:
a workflow whose one local step stores one `delta` through the very path a model call's
stream stores each frame (psycopg's own connection in autocommit, `append_streamed`), on a
turn row made for the bench, so the row counts the database's share of a turn's one step too.

The worker runs as its own process (so its CPU is counted apart from the bench client):

    python -m bench.skeleton --address 127.0.0.1:7233 --task-queue skeleton-x
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from temporalio import activity, workflow
from temporalio.client import Client
from temporalio.worker import Worker

from bench.runner import Phase, Turn
from parley.config import Settings
from parley.contracts import EventType, TurnState
from parley.store.db import Database, connect, create_engine, create_socket_checked_engine
from parley.store.events import append_streamed
from parley.store.models import ChatSession
from parley.store.models import Turn as TurnRow
from parley.wire import DeltaData
from parley.worker import worker_pool
from tests.support.orm import orm

ACTIVITIES = 9  # a Parley tool turn's regular activities (issue 12)
STEP_TIMEOUT = timedelta(seconds=30)


@activity.defn(name="skeleton_step")
async def skeleton_step(step: int) -> int:
    return step


@workflow.defn(name="SkeletonWorkflow", sandboxed=False)
class SkeletonWorkflow:
    @workflow.run
    async def run(self, shape: list[int]) -> int:
        """`shape` = [activities, local (0/1)]."""
        steps, local = shape
        total = 0
        for step in range(steps):
            if local:
                total += await workflow.execute_local_activity(
                    skeleton_step, step, start_to_close_timeout=STEP_TIMEOUT
                )
            else:
                total += await workflow.execute_activity(
                    skeleton_step, step, start_to_close_timeout=STEP_TIMEOUT
                )
        return total


class EventStep:
    """The new shape's one step, built with the worker's sessions like Parley's activities."""

    def __init__(self, sessions: Database) -> None:
        self._sessions = sessions

    @activity.defn(name="skeleton_store_event")
    async def store_event(self, turn_id: str) -> int:
        """One `delta` stored as `call_model` stores each streamed frame."""
        async with connect(self._sessions) as conn:
            appended = await append_streamed(
                conn,
                turn_id=turn_id,
                type=EventType.delta,
                data=DeltaData(message_id="msg_skeleton", text="skeleton "),
            )
            return appended.event_id


@workflow.defn(name="SkeletonNewShape", sandboxed=False)
class SkeletonNewShape:
    """Start, one workflow task in which one local step stores one event, done."""

    @workflow.run
    async def run(self, turn_id: str) -> int:
        return await workflow.execute_local_activity_method(
            EventStep.store_event, turn_id, start_to_close_timeout=STEP_TIMEOUT
        )


async def skeleton_turns(database_url: str, count: int) -> list[str]:
    """`count` turn rows for the new shape's steps to store events on, one per caller (two
    callers on one row would queue on its lock, which no two real turns share). Made ended,
    with their workflow marked started, so no sweep of the worker's ever takes them up."""
    engine = create_engine(database_url, pool_size=1)
    key = uuid.uuid4().hex[:12]
    session_id = f"ses_skel{key}"
    turn_ids = [f"trn_skel{key}{c:03d}" for c in range(count)]
    try:
        async with orm(Database(engine)) as db:
            db.add(ChatSession(id=session_id, tenant_id="northwind", user_id="cust_2291"))
            await db.flush()
            now = datetime.now(UTC)
            for seq, turn_id in enumerate(turn_ids, start=1):
                db.add(
                    TurnRow(
                        id=turn_id,
                        session_id=session_id,
                        tenant_id="northwind",
                        user_id="cust_2291",
                        user_message_id=f"msg_skel{key}{seq:03d}",
                        user_seq=seq,
                        state=TurnState.completed.value,
                        workflow_started_at=now,
                    )
                )
            await db.commit()
    finally:
        await engine.dispose()
    return turn_ids


@dataclass(frozen=True)
class Skeleton:
    """One skeleton row: the workflow it runs and that workflow's argument for each caller."""

    workflow: str
    arg: Callable[[int], Any]


def no_op_steps(steps: int, *, local: bool) -> Skeleton:
    return Skeleton("SkeletonWorkflow", lambda caller: [steps, int(local)])


def new_shape(turn_ids: Sequence[str]) -> Skeleton:
    return Skeleton("SkeletonNewShape", lambda caller: turn_ids[caller])


@activity.defn(name="skeleton_clock")
async def skeleton_clock() -> float:
    return time.time()


@workflow.defn(name="SkeletonFirstStep", sandboxed=False)
class SkeletonFirstStep:
    """A workflow whose first step is one regular activity that reads the clock: how soon
    Temporal alone gets a started workflow to its first step (the floor of (h))."""

    @workflow.run
    async def run(self) -> float:
        return await workflow.execute_activity(skeleton_clock, start_to_close_timeout=STEP_TIMEOUT)


async def first_step_ms(client: Client, task_queue: str, key: str) -> float:
    """From the client's start request to the skeleton's first activity running (ms)."""
    started = time.time()
    ran = await client.execute_workflow(
        SkeletonFirstStep.run,
        id=f"skeleton-first-{key}",
        task_queue=task_queue,
        execution_timeout=timedelta(seconds=60),
    )
    return (ran - started) * 1000


async def run_skeleton(
    client: Client, task_queue: str, workflow_name: str, arg: Any, workflow_id: str
) -> Turn:
    """One skeleton workflow run to its end, timed as a turn (its one step's work is all it
    does, so its first `delta` is its end)."""
    start = time.perf_counter()
    turn = Turn(ok=False)
    try:
        await client.execute_workflow(
            workflow_name,
            arg,
            id=workflow_id,
            task_queue=task_queue,
            execution_timeout=timedelta(seconds=60),
        )
        turn.ok, turn.total_s = True, time.perf_counter() - start
        turn.first_delta_s = turn.total_s
    except Exception as exc:  # counted and reported, never fatal to the run
        turn.error = f"{type(exc).__name__}: {exc}"
    return turn


async def floor(
    address: str, task_queue: str, skeleton: Skeleton, *, clients: int, per_client: int
) -> Phase:
    """`clients` callers, each running `per_client` skeleton workflows back to back."""
    client = await Client.connect(address)
    phase = Phase()
    run_id = uuid.uuid4().hex[:8]

    async def caller(c: int) -> None:
        for i in range(per_client):
            wid = f"skeleton-{run_id}-{c}-{i}"
            turn = await run_skeleton(client, task_queue, skeleton.workflow, skeleton.arg(c), wid)
            phase.turns.append(turn)

    started = time.perf_counter()
    await asyncio.gather(*(caller(c) for c in range(clients)))
    phase.wall_s = time.perf_counter() - started
    return phase


async def serve(address: str, task_queue: str) -> None:
    """The skeleton worker, with a database engine like the Parley worker's (its settings come
    from the same environment) for the new shape's step."""
    settings = Settings()
    if settings.database_url is None:
        raise SystemExit("DATABASE_URL is not set")
    pool = worker_pool(settings)
    engine = create_socket_checked_engine(
        settings.database_url, pool_size=pool["pool_size"], max_overflow=pool["max_overflow"]
    )
    client = await Client.connect(address)
    worker = Worker(
        client,
        task_queue=task_queue,
        workflows=[SkeletonWorkflow, SkeletonFirstStep, SkeletonNewShape],
        activities=[skeleton_step, skeleton_clock, EventStep(Database(engine)).store_event],
    )
    try:
        await worker.run()
    finally:
        await engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.skeleton")
    parser.add_argument("--address", required=True)
    parser.add_argument("--task-queue", required=True)
    args = parser.parse_args()
    asyncio.run(serve(args.address, args.task_queue))


if __name__ == "__main__":
    main()
