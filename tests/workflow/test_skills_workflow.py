"""The workflow alone (stub activities on the time-skipping server): a response that asks for
two skills runs them one after the other, each in the SKILL bundle, while two reads still run
side by side; the order is read from the closed workflow's history."""

from __future__ import annotations

from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowHistory
from temporalio.testing import WorkflowEnvironment

from parley.workflows.options import SKILL
from tests.support.time_skipping import turn
from tests.support.workflow_stubs import Stubs, tool

SCHEDULED = EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
COMPLETED = EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED


async def tool_steps(env: WorkflowEnvironment, calls: list[str]) -> tuple[list[str], Stubs]:
    """Run a turn whose first answer asks for `calls`; the execute_tool steps of its history
    as "scheduled <summary>" / "completed", in order."""
    stubs = Stubs()
    stubs.answers = [[tool(name, f"h{i}") for i, name in enumerate(calls)], []]
    async with turn(env, stubs) as handle:
        await handle.result()
        history: WorkflowHistory = await handle.fetch_history()
    tools: dict[int, str] = {}
    steps: list[str] = []
    for event in history.events:
        if event.event_type == SCHEDULED:
            attrs = event.activity_task_scheduled_event_attributes
            if attrs.activity_type.name == "execute_tool":
                tools[event.event_id] = str(attrs.start_to_close_timeout.ToSeconds())
                steps.append("scheduled")
        elif event.event_type == COMPLETED:
            if event.activity_task_completed_event_attributes.scheduled_event_id in tools:
                steps.append("completed")
    return steps + [",".join(tools.values())], stubs


async def test_two_skills_run_one_after_the_other_in_their_own_bundle(
    env: WorkflowEnvironment,
) -> None:
    steps, stubs = await tool_steps(env, ["run_skill", "run_skill"])
    assert len(stubs.inputs("execute_tool")) == 2
    timeout = str(int(SKILL.start_to_close.total_seconds()))
    assert steps == ["scheduled", "completed", "scheduled", "completed", f"{timeout},{timeout}"]


async def test_two_reads_still_run_side_by_side(env: WorkflowEnvironment) -> None:
    steps, _ = await tool_steps(env, ["get_order", "get_refund"])
    assert steps[:4] == ["scheduled", "scheduled", "completed", "completed"], steps
