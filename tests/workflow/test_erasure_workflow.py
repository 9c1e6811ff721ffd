"""The erasure workflow alone, its steps stubbed under their real names: the order of its
steps, the grace period (a durable timer, skipped here), the extra pass when rows came back,
the nothing-to-do run of an erasure already done, and giving up on rows that keep coming.

`PARLEY_RECORD_HISTORY=erasure_v1` writes each shape's history to
tests/histories/erasure_v1_<shape>.json for the replay tier.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass, field
from typing import Any

import pytest
from temporalio import activity
from temporalio.client import WorkflowFailureError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from parley.erasure import (
    ERASURE_WORKFLOW,
    EraseTableInput,
    ErasureInput,
    ErasurePlan,
    ErasureReceipt,
)
from parley.workflows.erasure import MAX_PASSES, ErasureWorkflow
from tests.support.histories import HISTORIES, replayer, scrub


@dataclass
class Steps:
    """The erasure's steps, answering from a script and recording what ran."""

    tables: list[str] = field(default_factory=lambda: ["turn_events", "messages", "users"])
    # What each check answers, in turn (then: nothing left).
    left: list[dict[str, int]] = field(default_factory=list)
    ran: list[str] = field(default_factory=list)

    def activities(self) -> list[Any]:
        @activity.defn(name="begin_erasure")
        async def begin(inp: ErasureInput) -> ErasurePlan:
            self.ran.append("begin")
            return ErasurePlan(tables=list(self.tables))

        @activity.defn(name="stop_turns")
        async def stop(inp: ErasureInput) -> int:
            self.ran.append("stop_turns")
            return 0

        @activity.defn(name="forget_workflows")
        async def forget(inp: ErasureInput) -> int:
            self.ran.append("forget_workflows")
            return 2

        @activity.defn(name="erase_table")
        async def erase(inp: EraseTableInput) -> int:
            self.ran.append(inp.table)
            return 1

        @activity.defn(name="remaining_rows")
        async def remaining(inp: ErasureInput) -> dict[str, int]:
            self.ran.append("check")
            return self.left.pop(0) if self.left else {}

        @activity.defn(name="finish_erasure")
        async def finish(inp: ErasureInput) -> ErasureReceipt:
            self.ran.append("finish")
            return ErasureReceipt(inp.erasure_id, dict.fromkeys(self.tables, 1))

        return [begin, stop, forget, erase, remaining, finish]


async def run(
    env: WorkflowEnvironment, steps: Steps, *, grace_s: float = 0.0, name: str
) -> tuple[ErasureReceipt | None, Any]:
    queue = f"erase-{uuid.uuid4().hex[:8]}"
    async with Worker(
        env.client, task_queue=queue, workflows=[ErasureWorkflow], activities=steps.activities()
    ):
        handle = await env.client.start_workflow(
            ERASURE_WORKFLOW,
            ErasureInput(erasure_id="era_test", grace_s=grace_s),
            id=f"erasure-{name}-{uuid.uuid4().hex[:6]}",
            task_queue=queue,
            result_type=ErasureReceipt,
        )
        try:
            result: ErasureReceipt | None = await handle.result()
        except WorkflowFailureError:
            result = None
        history = await handle.fetch_history()
    await replayer(ErasureWorkflow).replay_workflow(history)
    recording = os.environ.get("PARLEY_RECORD_HISTORY")
    if recording:
        (HISTORIES / f"{recording}_{name}.json").write_text(scrub(history.to_json()))
    return result, history


TABLES = ["turn_events", "messages", "users"]


async def test_a_user_is_erased_step_by_step_and_ends_with_the_receipt(
    env: WorkflowEnvironment,
) -> None:
    steps = Steps()
    result, _ = await run(env, steps, name="user")
    assert steps.ran == ["begin", "stop_turns", "forget_workflows", *TABLES, "check", "finish"]
    assert result is not None and result.counts == dict.fromkeys(TABLES, 1)


async def test_a_deleted_session_waits_out_its_grace_period_first(
    env: WorkflowEnvironment,
) -> None:
    steps = Steps()
    before = await env.get_current_time()
    result, history = await run(env, steps, grace_s=3600, name="session_grace")
    assert (await env.get_current_time() - before).total_seconds() >= 3600
    assert steps.ran[0] == "begin" and result is not None
    assert "TIMER_STARTED" in history.to_json()


async def test_rows_that_came_back_are_erased_by_another_pass(env: WorkflowEnvironment) -> None:
    steps = Steps(left=[{"trace_spans": 1}])
    result, _ = await run(env, steps, name="second_pass")
    assert steps.ran.count("check") == 2 and steps.ran.count("messages") == 2
    assert result is not None


async def test_an_erasure_already_done_only_returns_its_receipt(
    env: WorkflowEnvironment,
) -> None:
    steps = Steps(tables=[])
    result, _ = await run(env, steps, name="done_already")
    assert steps.ran == ["begin", "finish"] and result is not None


async def test_rows_that_keep_coming_back_fail_the_run_after_its_passes(
    env: WorkflowEnvironment,
) -> None:
    steps = Steps(left=[{"trace_spans": 1}] * MAX_PASSES)
    result, _ = await run(env, steps, name="gave_up")
    assert result is None and steps.ran.count("check") == MAX_PASSES
    assert "finish" not in steps.ran


@pytest.mark.parametrize("grace_s", [0.0, 5.0])
def test_the_input_carries_ids_and_a_wait_only(grace_s: float) -> None:
    inp = ErasureInput(erasure_id="era_x", grace_s=grace_s)
    assert set(vars(inp)) == {"erasure_id", "grace_s"}
