"""(j) What the workflow code costs the worker per turn: committed histories replayed in one
process, under the worker's runner (dispatch/runner.py: no sandbox, or its sandbox with
`PARLEY_WORKFLOW_SANDBOX=on`) and under the SDK's default sandbox.

A replay runs exactly the Python a live worker runs for the workflow (every activation, the
sandbox around it, the commands it answers), without the activities, the server or the
database: the figure is the workflow's own share of a turn's worker CPU. The default
sandbox is the baseline: it imports each workflow module afresh for every run.

    python -m bench.replay_cost
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from temporalio.client import WorkflowHistory
from temporalio.converter import DataConverter
from temporalio.worker import Replayer, WorkflowRunner
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

from parley.dispatch.runner import workflow_runner
from parley.workflows.specialist import SpecialistWorkflow
from parley.workflows.summary import SummaryWorkflow
from parley.workflows.turn import TurnWorkflow

HISTORIES = Path(__file__).resolve().parent.parent / "tests" / "histories"
SHAPES = ("plain", "tool", "confirmed")
RUNS = 60
ROUNDS = 3  # interleaved; the best round of each runner counts (bursts only add time)


def newest_generation() -> str:
    """The prefix of the newest recording: `turn_vN` with the largest N."""
    numbers = [int(p.name.split("_")[1][1:]) for p in HISTORIES.glob("turn_v*_plain.json")]
    return f"turn_v{max(numbers)}"


async def _cpu_ms_per_run(runner: WorkflowRunner, raw: str, runs: int) -> float:
    replayer = Replayer(
        workflows=[TurnWorkflow, SpecialistWorkflow, SummaryWorkflow], workflow_runner=runner
    )

    async def histories(count: int) -> Any:
        for i in range(count):
            yield WorkflowHistory.from_json(f"replay-{i}", raw)

    await replayer.replay_workflows(histories(3))  # imports, caches
    start = time.process_time()
    await replayer.replay_workflows(histories(runs))
    return (time.process_time() - start) * 1000 / runs


async def measure_replay_cost(runs: int = RUNS) -> dict[str, Any]:
    generation = newest_generation()
    runners: dict[str, WorkflowRunner] = {
        "default sandbox": SandboxedWorkflowRunner(),
        "worker's sandbox": workflow_runner(DataConverter.default, sandboxed=True),
        "worker's runner": workflow_runner(DataConverter.default, sandboxed=False),
    }
    shapes: dict[str, dict[str, float]] = {}
    for shape in SHAPES:
        path = HISTORIES / f"{generation}_{shape}.json"
        if not path.exists():
            continue
        raw = path.read_text()
        best = {name: float("inf") for name in runners}
        for _ in range(ROUNDS):
            for name, runner in runners.items():
                best[name] = min(best[name], await _cpu_ms_per_run(runner, raw, runs))
        shapes[shape] = {name: round(ms, 2) for name, ms in best.items()}
    return {"generation": generation, "runs": runs, "cpu_ms_per_run": shapes}


def render_replay_cost(result: dict[str, Any]) -> str:
    lines = [
        f"(j) Workflow code per turn: CPU ms per replay of a committed {result['generation']} "
        f"history ({result['runs']} runs, best of {ROUNDS} rounds; no activities, server or "
        "database)",
        f"  {'shape':<10} {'default sandbox':>16} {'sandbox on':>11} {'worker runner':>14} "
        f"{'ratio':>7}",
    ]
    for shape, figures in result["cpu_ms_per_run"].items():
        base, ours = figures["default sandbox"], figures["worker's runner"]
        boxed = figures.get("worker's sandbox", float("nan"))
        ratio = ours / base if base else float("nan")
        lines.append(f"  {shape:<10} {base:>16.2f} {boxed:>11.2f} {ours:>14.2f} {ratio:>6.2f}x")
    lines.append(
        "  (sandbox on: the worker with PARLEY_WORKFLOW_SANDBOX=on; worker runner: its default, "
        "no sandbox)"
    )
    return "\n".join(lines)


def main() -> None:
    print(render_replay_cost(asyncio.run(measure_replay_cost())))


if __name__ == "__main__":
    main()
