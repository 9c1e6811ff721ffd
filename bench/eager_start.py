"""(m) Eager workflow start: does a process that is both the API and a worker get a turn to its
first step sooner?

With `request_eager_start=True` (and `system.enableEagerWorkflowStart` on the server) the
start call's response carries the workflow's first task, and a worker running on the same
`Client` object and task queue takes it at once, with no trip through matching. Parley's API
runs no worker unless `PARLEY_API_WORKER` is set; this measures what running one there buys
(a process that is both API and worker shares its CPU and its lifetime between the two: a
deploy of either restarts both).

One process starts a Temporal dev server (eager activity dispatch and eager workflow start
on), runs two workers on one client (a pinned version of a Worker Deployment, as Parley's
workers are by default, and an unversioned one, each on its own queue) and starts small
workflows on the same client, with and without `request_eager_start`, in alternating blocks:

- `activity`: the first step is a regular activity that reads the clock (a turn's first
  step before generation 12);
- `local`: the first step is a local activity that reads the clock.

The figure is the time from just before `start_workflow` to the first step's clock reading
(one clock, one process), then p50/p95 per mode, how many starts the server really made eager,
and the CPU of this process and the dev server per workflow.

    python -m bench.eager_start [--runs 60]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
import uuid
from datetime import timedelta
from typing import Any

from temporalio import activity, workflow
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from bench.cpu import Roles, snapshot, usage
from bench.runner import percentile
from bench.stack import LOG_DIR, guard
from parley.config import Settings
from parley.dispatch.deployment import deployment_config, promote_configured
from parley.launch.dev import EAGER_ACTIVITIES, EAGER_WORKFLOW_START, temporal_cli

STEP_TIMEOUT = timedelta(seconds=30)
# Each mode runs in blocks of this many workflows, the modes taking turns, so a burst of
# another process's work lands on every mode alike.
BLOCK = 10
WARMUP = 5  # workflows per mode before measuring (worker caches, the server's first starts)
# Keep an eager start only for a clear gain on the time to the first step.
WORTH_IT = 0.20


@activity.defn(name="eager_bench_clock")
async def clock() -> float:
    return time.time()


@workflow.defn(name="EagerFirstStep", sandboxed=False)
class EagerFirstStep:
    """One step that reads the clock: a regular activity or a local one."""

    @workflow.run
    async def run(self, local: bool) -> float:
        if local:
            return await workflow.execute_local_activity(clock, start_to_close_timeout=STEP_TIMEOUT)
        return await workflow.execute_activity(clock, start_to_close_timeout=STEP_TIMEOUT)


# (worker, first step, eager start): the versioned worker is Parley's default.
MODES = [
    (worker, step, eager)
    for worker in ("versioned", "unversioned")
    for step in ("activity", "local")
    for eager in (False, True)
]


def mode_name(worker: str, step: str, eager: bool) -> str:
    return f"{worker}/{step}/{'eager' if eager else 'plain'}"


async def _quiet_dev_server() -> WorkflowEnvironment:
    """The dev server with both eager switches on, its banner sent to a log file instead of
    our stdout (the server inherits fd 1), as bench/stack.py does for the main stack."""
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    saved = os.dup(1)
    with (LOG_DIR / "temporal-eager.log").open("wb") as server_log:
        os.dup2(server_log.fileno(), 1)
        try:
            return await WorkflowEnvironment.start_local(
                dev_server_existing_path=temporal_cli(),
                dev_server_log_level="error",
                dev_server_extra_args=[*EAGER_ACTIVITIES, *EAGER_WORKFLOW_START],
            )
        finally:
            os.dup2(saved, 1)
            os.close(saved)
            guard().watch_dev_servers()  # it dies with the bench (bench/stack.py)


async def first_step(client: Client, queue: str, step: str, eager: bool) -> tuple[float, bool]:
    """Seconds from the start request to the first step's clock, and whether the server
    handed the first workflow task back in the start response."""
    started = time.time()
    handle = await client.start_workflow(
        EagerFirstStep.run,
        step == "local",
        id=f"eager-{uuid.uuid4().hex[:12]}",
        task_queue=queue,
        execution_timeout=timedelta(seconds=60),
        request_eager_start=eager,
    )
    ran = await handle.result()
    return ran - started, bool(getattr(handle, "__temporal_eagerly_started", False))


def floor_worker(client: Client, queue: str, settings: Settings | None = None) -> Worker:
    return Worker(
        client,
        task_queue=queue,
        workflows=[EagerFirstStep],
        activities=[clock],
        deployment_config=deployment_config(settings) if settings is not None else None,
    )


async def measure_eager_start(runs: int = 60) -> dict[str, Any]:
    """`runs` workflows per mode (see MODES), measured in alternating blocks."""
    env = await _quiet_dev_server()
    try:
        client = env.client
        versioned = Settings(
            database_url="postgresql://unused",
            worker_deployment=f"eager-bench-{uuid.uuid4().hex[:6]}",
            worker_build_id="bench",
        )
        queues = {"versioned": f"eager-v-{uuid.uuid4().hex[:6]}"}
        queues["unversioned"] = f"eager-u-{uuid.uuid4().hex[:6]}"
        # Both workers on the client that starts the workflows: eager start needs that.
        async with (
            floor_worker(client, queues["versioned"], versioned),
            floor_worker(client, queues["unversioned"], None),
        ):
            await promote_configured(client, versioned)
            for worker, step, eager in MODES:
                for _ in range(WARMUP):
                    await first_step(client, queues[worker], step, eager)
            return await _measure(client, queues, runs)
    finally:
        await env.shutdown()


async def _measure(client: Client, queues: dict[str, str], runs: int) -> dict[str, Any]:
    seconds: dict[str, list[float]] = {mode_name(*mode): [] for mode in MODES}
    eager_starts = dict.fromkeys(seconds, 0)
    cpu_s = dict.fromkeys(seconds, 0.0)
    # The bench's watchman (bench/stack.py `guard`) is its other child, and the bench's own.
    roles = Roles({os.getpid(): "bench", guard().lifeline.pid: "bench"}, {os.getpid(): "temporal"})
    for _ in range(-(-runs // BLOCK)):
        for worker, step, eager in MODES:
            name = mode_name(worker, step, eager)
            before = snapshot()
            for _ in range(min(BLOCK, runs - len(seconds[name]))):
                elapsed, was_eager = await first_step(client, queues[worker], step, eager)
                seconds[name].append(elapsed)
                eager_starts[name] += was_eager
            spent = usage(before, snapshot(), roles)
            cpu_s[name] += spent.get("bench_cpu_s", 0.0) + spent.get("temporal_cpu_s", 0.0)
    rows = {}
    for name, values in seconds.items():
        rows[name] = {
            "runs": len(values),
            "p50_ms": round(percentile(values, 0.50) * 1000, 2),
            "p95_ms": round(percentile(values, 0.95) * 1000, 2),
            "eager_starts": eager_starts[name],
            "cpu_ms_per_workflow": round(cpu_s[name] * 1000 / max(len(values), 1), 2),
        }
    gains = {}
    for worker in queues:
        for step in ("activity", "local"):
            plain = rows[mode_name(worker, step, False)]["p50_ms"]
            eager_ms = rows[mode_name(worker, step, True)]["p50_ms"]
            gains[f"{worker}/{step}"] = round(1 - eager_ms / plain, 3) if plain else None
    return {"runs": runs, "rows": rows, "p50_gain": gains}


def render_eager_start(result: dict[str, Any]) -> str:
    lines = [
        f"(m) Eager workflow start, API and worker in one process on one client: ms from "
        f"start_workflow to the first step, {result['runs']} workflows per mode",
        f"  {'worker/first step/start':34} {'p50':>8} {'p95':>8} {'eager':>7} {'CPU ms/wf':>10}",
    ]
    for name, row in result["rows"].items():
        lines.append(
            f"  {name:34} {row['p50_ms']:8.2f} {row['p95_ms']:8.2f} "
            f"{row['eager_starts']:>3}/{row['runs']:<3} {row['cpu_ms_per_workflow']:10.2f}"
        )
    for key, gain in result["p50_gain"].items():
        verdict = "worth it" if gain is not None and gain > WORTH_IT else "not worth it"
        shown = "n/a" if gain is None else f"{gain:.0%}"
        lines.append(f"  {key}: eager start saves {shown} of p50 ({verdict} at > {WORTH_IT:.0%})")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=60, help="workflows per mode")
    args = parser.parse_args()
    print(render_eager_start(asyncio.run(measure_eager_start(args.runs))))


if __name__ == "__main__":
    main()
