"""The export and retention purge workflows alone, on the time-skipping server, their steps
stubbed under the real activity names: an export that is written, one whose attempts are
spent (marked failed, never left running), and a purge that empties each planned table batch
by batch with its moment fixed once.

`PARLEY_RECORD_HISTORY=data_vN` writes each run's history to tests/histories/
(`data_vN_export_ready.json`, ...), which tests/replay/test_replay.py replays on later code.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass, field

from temporalio import activity
from temporalio.client import WorkflowHistory
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from parley.data_contracts import (
    EXPORT_WORKFLOW,
    PURGE_WORKFLOW,
    ExportInput,
    ExportResult,
    PurgeBatchInput,
    PurgeInput,
    PurgePlan,
    PurgeResult,
    PurgeTask,
)
from parley.workflows.export import ExportWorkflow
from parley.workflows.retention import RetentionPurgeWorkflow
from tests.support.histories import HISTORIES, replayer, scrub


@dataclass
class DataStubs:
    """The four steps, answered from memory: rows per (tenant, table) left to purge."""

    export_fails: bool = False
    left: dict[tuple[str, str], int] = field(default_factory=dict)
    calls: list[str] = field(default_factory=list)
    plan_inputs: list[PurgeInput] = field(default_factory=list)

    def activities(self) -> list[object]:
        @activity.defn(name="write_export")
        async def write_export(inp: ExportInput) -> ExportResult:
            self.calls.append("write_export")
            if self.export_fails:
                raise ApplicationError("the database is gone", non_retryable=True)
            return ExportResult(inp.export_id, "ready", {"sessions": 2})

        @activity.defn(name="fail_export")
        async def fail_export(inp: ExportInput) -> ExportResult:
            self.calls.append("fail_export")
            return ExportResult(inp.export_id, "failed")

        @activity.defn(name="plan_purge")
        async def plan_purge(inp: PurgeInput) -> PurgePlan:
            self.plan_inputs.append(inp)
            return PurgePlan(
                [PurgeTask(t, table, "2026-01-01T00:00:00+00:00") for t, table in self.left]
            )

        @activity.defn(name="purge_batch")
        async def purge_batch(inp: PurgeBatchInput) -> int:
            key = (inp.task.tenant_id, inp.task.table)
            deleted = min(self.left[key], inp.batch_size)
            self.left[key] -= deleted
            self.calls.append(f"purge {inp.task.table}")
            return deleted

        return [write_export, fail_export, plan_purge, purge_batch]


async def _run(
    env: WorkflowEnvironment, stubs: DataStubs, workflow: str, arg: object, result: type
) -> tuple[object, WorkflowHistory]:
    queue = f"data-{uuid.uuid4().hex[:8]}"
    async with Worker(
        env.client,
        task_queue=queue,
        workflows=[ExportWorkflow, RetentionPurgeWorkflow],
        activities=stubs.activities(),  # type: ignore[arg-type]
    ):
        handle = await env.client.start_workflow(
            workflow, arg, id=f"wf-{uuid.uuid4().hex[:8]}", task_queue=queue, result_type=result
        )
        outcome = await handle.result()
        history = await handle.fetch_history()
    await replayer(ExportWorkflow, RetentionPurgeWorkflow).replay_workflow(history)
    return outcome, history


def _record(name: str, history: WorkflowHistory) -> None:
    recording = os.environ.get("PARLEY_RECORD_HISTORY")
    if recording:
        (HISTORIES / f"{recording}_{name}.json").write_text(scrub(history.to_json()))


async def test_an_export_is_written_once(env: WorkflowEnvironment) -> None:
    stubs = DataStubs()
    result, history = await _run(env, stubs, EXPORT_WORKFLOW, ExportInput("exp_1"), ExportResult)
    assert result == ExportResult("exp_1", "ready", {"sessions": 2})
    assert stubs.calls == ["write_export"]
    _record("export_ready", history)


async def test_an_export_whose_attempts_are_spent_is_marked_failed(
    env: WorkflowEnvironment,
) -> None:
    stubs = DataStubs(export_fails=True)
    result, history = await _run(env, stubs, EXPORT_WORKFLOW, ExportInput("exp_2"), ExportResult)
    assert result == ExportResult("exp_2", "failed")
    assert stubs.calls == ["write_export", "fail_export"]
    _record("export_failed", history)


async def test_a_purge_empties_each_table_batch_by_batch(env: WorkflowEnvironment) -> None:
    stubs = DataStubs(left={("t1", "feedback"): 1, ("t1", "messages"): 5, ("t2", "exports"): 0})
    result, history = await _run(
        env, stubs, PURGE_WORKFLOW, PurgeInput(tenant_id=None, batch_size=2), PurgeResult
    )
    assert result == PurgeResult({"feedback": 1, "messages": 5, "exports": 0})
    # A short batch ends a table: 1 < 2 at once, 2 + 2 + 1 for the messages, 0 for exports.
    assert stubs.calls == ["purge feedback", *["purge messages"] * 3, "purge exports"]
    assert not any(stubs.left.values())
    # The moment is fixed before planning (the workflow's clock: no `now` was given).
    [planned] = stubs.plan_inputs
    assert planned.now is not None and planned.batch_size == 2
    _record("purge", history)
