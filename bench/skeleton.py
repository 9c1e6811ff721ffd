"""The floor Temporal itself sets: a skeleton workflow of no-op activities, same dev server.

A Parley turn is a workflow of a handful of activities; this measures how many workflows of
that shape per second the same Temporal dev server and a worker like Parley's can run on this
machine when the activities do nothing at all, once as regular activities (each a trip
through the task queue) and once as local activities (run inside the workflow task's
worker, recorded as markers). Parley's turns/s is read against the regular row with the
same number of activities.

The worker runs as its own process (so its CPU is counted apart from the bench client):

    python -m bench.skeleton --address 127.0.0.1:7233 --task-queue skeleton-x
"""

from __future__ import annotations

import argparse
import asyncio
import time
from datetime import timedelta

from temporalio import activity, workflow
from temporalio.client import Client
from temporalio.worker import Worker

from bench.runner import Phase, Turn

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


async def floor(
    address: str, task_queue: str, *, clients: int, per_client: int, steps: int, local: bool
) -> Phase:
    """`clients` callers, each running `per_client` skeleton workflows back to back."""
    client = await Client.connect(address)
    phase = Phase()
    run_id = f"{int(time.time() * 1000)}-{int(local)}"

    async def caller(c: int) -> None:
        for i in range(per_client):
            start = time.perf_counter()
            turn = Turn(ok=False)
            try:
                await client.execute_workflow(
                    SkeletonWorkflow.run,
                    [steps, int(local)],
                    id=f"skeleton-{run_id}-{c}-{i}",
                    task_queue=task_queue,
                    execution_timeout=timedelta(seconds=60),
                )
                turn.ok, turn.total_s = True, time.perf_counter() - start
                turn.first_delta_s = turn.total_s
            except Exception as exc:  # counted and reported, never fatal to the run
                turn.error = f"{type(exc).__name__}: {exc}"
            phase.turns.append(turn)

    started = time.perf_counter()
    await asyncio.gather(*(caller(c) for c in range(clients)))
    phase.wall_s = time.perf_counter() - started
    return phase


async def serve(address: str, task_queue: str) -> None:
    client = await Client.connect(address)
    worker = Worker(
        client,
        task_queue=task_queue,
        workflows=[SkeletonWorkflow, SkeletonFirstStep],
        activities=[skeleton_step, skeleton_clock],
    )
    await worker.run()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.skeleton")
    parser.add_argument("--address", required=True)
    parser.add_argument("--task-queue", required=True)
    args = parser.parse_args()
    asyncio.run(serve(args.address, args.task_queue))


if __name__ == "__main__":
    main()
