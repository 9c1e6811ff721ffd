"""The turn workflow's lifecycle rules alone, on the time-skipping server with stub
activities: a Stop is honoured at every step boundary even when the step finished anyway,
a step that finds the turn stopped ends it, decisions arrive as a validated Update (the
previous build's recordings deliver them by signal, which the turn still takes), paused
and failing steps end the turn with a contract code, and the caps count every request.

Histories of cancelled, failed, expired, declined and superseded turns were recorded here
as turn_v5_*; tests/workflow/test_replay_shapes.py now records every shape (turn_v6_* on).
"""

from __future__ import annotations

import asyncio
import uuid

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowUpdateFailedError
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment

from parley.contracts import (
    MAX_MODEL_CALLS,
    MAX_TOOL_CALLS_PER_RESPONSE,
    TURN_STOPPED,
    ResolveActionSignal,
    TurnInput,
    TurnState,
)
from parley.dispatch.control import deliver_decision
from parley.workflows.turn import BOUNDS_TEXT, SENT_TEXT, TurnWorkflow
from parley.workflows.wording import TOO_MANY_TOOLS
from tests.support.time_skipping import (
    STEP_DEADLINE_S,
    decide,
    end_if_running,
    ends_cancelled,
    proposing,
    reached,
    replays,
    stub_worker,
    turn,
    waiting_for_confirmation,
)
from tests.support.workflow_stubs import ACTION_ID, QUICK_RETRY, Stubs, tool, unavailable

CANCEL_REQUESTED = EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CANCEL_REQUESTED
SIGNALED = EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED


# --- a Stop that a finishing step would have swallowed ----------------------------------------


@pytest.mark.parametrize(
    ("step", "answers"),
    [
        ("build_context", []),
        ("screen_input", []),
        ("call_model", []),
        ("call_model", [[tool("get_order", "h1")]]),
        ("execute_tool", [[tool("get_order", "h1")]]),
        ("request_confirmation", proposing()),
        ("judge_output", []),
    ],
)
async def test_a_stop_during_a_step_that_finishes_anyway_still_ends_the_turn_cancelled(
    temporal_env: WorkflowEnvironment, stubs: Stubs, step: str, answers: list
) -> None:
    # On the real dev server: the time-skipping test server refuses a cancel request for an
    # activity that goes on to complete (ACTIVITY_UNKNOWN), the very race this covers.
    stubs.answers = list(answers)
    stubs.stubborn = {step}
    async with turn(temporal_env, stubs) as handle:
        await reached(stubs, step)
        await handle.cancel()
        stubs.released[step].set()  # the step reports success after the cancel
        # A plain answer is one workflow task: a Stop during any of its steps comes in the
        # task that would have finished the turn, which the server then refuses.
        plain = step in ("build_context", "screen_input", "judge_output") or not answers
        await ends_cancelled(handle, stubs, in_a_refused_task=plain)
        if step == "call_model" and not answers:
            await replays(handle, "_cancelled")
    assert step in stubs.finished
    assert "send_email" not in stubs.names()


async def test_no_send_starts_after_a_stop_that_came_with_the_confirm(
    env: WorkflowEnvironment, stubs: Stubs
) -> None:
    stubs.answers = proposing()
    async with turn(env, stubs) as handle:
        await reached(stubs, "request_confirmation")
        await asyncio.wait_for(waiting_for_confirmation(handle), STEP_DEADLINE_S)
        await handle.cancel()
        confirmed = ResolveActionSignal(ACTION_ID, "confirmed")
        await handle.signal(TurnWorkflow.resolve_action, confirmed)
        await ends_cancelled(handle, stubs)
        order = [
            e.event_type
            async for e in handle.fetch_history_events()
            if e.event_type in (CANCEL_REQUESTED, SIGNALED)
        ]
    # The Stop was sent first, but the server alone orders the two; on a busy machine the
    # confirm can be recorded first, and a send that started before the Stop rightly runs.
    # Whenever the history has the Stop first, no send may start.
    if order == [CANCEL_REQUESTED, SIGNALED]:
        assert "send_email" not in stubs.names()
    else:
        assert order == [SIGNALED, CANCEL_REQUESTED], order


async def test_a_stop_recorded_before_the_confirm_in_one_workflow_task_starts_no_send(
    env: WorkflowEnvironment, stubs: Stubs
) -> None:
    # No worker polls while the Stop and then the confirm are recorded, so the next workflow
    # task brings both at once: the history orders them, and the Stop came first.
    stubs.answers = proposing()
    queue = f"wf-{uuid.uuid4().hex[:8]}"
    # No sticky queue: the next task must go to whichever worker polls next.
    handle = await env.client.start_workflow(
        TurnWorkflow.run,
        TurnInput("turn_batched", "ses_1", "northwind"),
        id=f"turn-{uuid.uuid4().hex[:8]}",
        task_queue=queue,
    )
    try:
        async with stub_worker(env, stubs, queue, max_cached_workflows=0):
            await asyncio.wait_for(waiting_for_confirmation(handle), STEP_DEADLINE_S)
        await handle.cancel()
        confirmed = ResolveActionSignal(ACTION_ID, "confirmed")
        await handle.signal(TurnWorkflow.resolve_action, confirmed)
        async with stub_worker(env, stubs, queue):
            await ends_cancelled(handle, stubs)
    finally:
        await end_if_running(handle)
    order = [
        e.event_type
        async for e in handle.fetch_history_events()
        if e.event_type in (CANCEL_REQUESTED, SIGNALED)
    ]
    assert order == [CANCEL_REQUESTED, SIGNALED]
    assert "send_email" not in stubs.names()


async def test_a_step_that_finds_the_turn_stopped_ends_it_without_finalizing(
    env: WorkflowEnvironment, stubs: Stubs
) -> None:
    # The Stop was recorded on the row but the workflow's cancel never arrived.
    stubs.errors["call_model"] = ApplicationError("stopped", type=TURN_STOPPED, non_retryable=True)
    async with turn(env, stubs) as handle:
        assert (await handle.result()).ending == "stopped"
    assert len(stubs.inputs("call_model")) == 1  # never retried
    assert len(stubs.inputs("cancel_turn")) == 1
    assert "finalize" not in stubs.names() and "fail_turn" not in stubs.names()


# --- failures end with a code from the contract ---------------------------------------------


async def test_a_pause_noticed_before_a_model_call_fails_the_turn_retryably(
    env: WorkflowEnvironment, stubs: Stubs
) -> None:
    stubs.answers = [
        ApplicationError("paused", type="agent_paused", non_retryable=True),
    ]
    async with turn(env, stubs, fallback=True) as handle:
        assert (await handle.result()).ending == "failed"
    assert len(stubs.inputs("call_model")) == 1  # no retry, no fallback
    [failed] = stubs.inputs("fail_turn")
    assert (failed.code, failed.retryable) == ("agent_paused", True)


async def test_a_prompt_too_large_for_the_model_fails_with_its_own_code_not_retryably(
    env: WorkflowEnvironment, stubs: Stubs
) -> None:
    stubs.errors["build_context"] = ApplicationError(
        "the required blocks need 9000 tokens", type="context_too_large", non_retryable=True
    )
    async with turn(env, stubs) as handle:
        assert (await handle.result()).ending == "failed"
    assert stubs.inputs("call_model") == []  # nothing was sent to the model
    [failed] = stubs.inputs("fail_turn")
    assert (failed.code, failed.retryable) == ("context_too_large", False)


async def test_an_unknown_failure_type_never_reaches_the_client_as_a_class_name(
    env: WorkflowEnvironment, stubs: Stubs
) -> None:
    # Retried soon (QUICK_RETRY): the policy's own backoff would be waited in real time.
    stubs.model = lambda inp: ApplicationError(
        "db", type="OperationalError", next_retry_delay=QUICK_RETRY
    )
    async with turn(env, stubs) as handle:
        assert (await handle.result()).ending == "failed"
        await replays(handle, "_failed")
    [failed] = stubs.inputs("fail_turn")
    assert (failed.code, failed.retryable) == ("model_failed", True)


async def test_a_database_outage_that_outlasts_the_model_retries_fails_with_its_code(
    env: WorkflowEnvironment, stubs: Stubs
) -> None:
    # As the real failure mapper words it once the database answers again (activities/
    # failures.py gives every store_unavailable a next_retry_delay), but sooner.
    stubs.model = lambda inp: ApplicationError(
        "down", type="store_unavailable", next_retry_delay=QUICK_RETRY
    )
    async with turn(env, stubs) as handle:
        assert (await handle.result()).ending == "failed"
    [failed] = stubs.inputs("fail_turn")
    assert (failed.code, failed.retryable) == ("store_unavailable", True)


# --- decisions as a validated Update --------------------------------------------------------


async def test_an_update_decides_only_the_action_the_turn_waits_for(
    env: WorkflowEnvironment, stubs: Stubs
) -> None:
    stubs.answers = proposing()
    async with turn(env, stubs) as handle:
        await reached(stubs, "request_confirmation")
        with pytest.raises(WorkflowUpdateFailedError):
            await handle.execute_update(
                TurnWorkflow.decide_action, ResolveActionSignal("act_other", "confirmed")
            )
        with pytest.raises(WorkflowUpdateFailedError):
            await handle.execute_update(
                TurnWorkflow.decide_action, ResolveActionSignal(ACTION_ID, "maybe")
            )
        taken = await handle.execute_update(
            TurnWorkflow.decide_action, ResolveActionSignal(ACTION_ID, "confirmed")
        )
        assert taken == "confirmed"
        # A second delivery of another answer does not change the first.
        again = await handle.execute_update(
            TurnWorkflow.decide_action, ResolveActionSignal(ACTION_ID, "declined")
        )
        assert again == "confirmed"
        await handle.result()
    assert stubs.names().count("send_email") == 1


async def test_a_decision_the_turn_does_not_wait_for_is_delivered_no_other_way(
    env: WorkflowEnvironment, stubs: Stubs
) -> None:
    # One route (dispatch/control.py): refused by the turn and with no specialist to take it,
    # a decision is left to the store, which the turn reads when its wait ends.
    stubs.answers = proposing()
    async with turn(env, stubs) as handle:
        await reached(stubs, "request_confirmation")
        turn_id = handle.id.removeprefix("turn-")
        other = ResolveActionSignal("act_other", "confirmed")
        assert not await deliver_decision(
            env.client, turn_id=turn_id, decision=other, patience_s=0.3
        )
        mine = ResolveActionSignal(ACTION_ID, "confirmed")
        assert await deliver_decision(env.client, turn_id=turn_id, decision=mine)
        await handle.result()
        kinds = [e.event_type async for e in handle.fetch_history_events()]
    assert SIGNALED not in kinds
    assert kinds.count(EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED) == 1
    assert stubs.names().count("send_email") == 1


@pytest.mark.parametrize("decision", ["declined", "superseded"])
async def test_declined_and_superseded_turns_replay(
    env: WorkflowEnvironment, stubs: Stubs, decision: str
) -> None:
    stubs.answers = proposing()
    async with turn(env, stubs) as handle:
        await decide(handle, stubs, decision)
        await handle.result()
        await replays(handle, f"_{decision}")
    assert "send_email" not in stubs.names()


async def test_an_expired_turn_replays(env: WorkflowEnvironment, stubs: Stubs) -> None:
    stubs.answers = proposing()
    async with turn(env, stubs) as handle:
        await handle.result()
        assert await handle.query(TurnWorkflow.state) == TurnState.expired
        await replays(handle, "_expired")


# --- caps ------------------------------------------------------------------------------------


async def test_at_most_eight_tool_calls_of_one_response_run_the_rest_are_refused(
    env: WorkflowEnvironment, stubs: Stubs
) -> None:
    many = [tool("get_order", f"h{n}") for n in range(MAX_TOOL_CALLS_PER_RESPONSE + 3)]
    stubs.answers = [many, []]
    async with turn(env, stubs) as handle:
        await handle.result()
    jobs = stubs.inputs("execute_tool")
    assert len(jobs) == len(many)  # every call gets a result the model can read
    ran = [j for j in jobs if j.refuse is None]
    refused = [j for j in jobs if j.refuse is not None]
    assert len(ran) == MAX_TOOL_CALLS_PER_RESPONSE
    assert len(refused) == 3 and all(j.refuse == TOO_MANY_TOOLS for j in refused)


async def test_retries_and_fallback_requests_count_against_the_turns_cap(
    env: WorkflowEnvironment, stubs: Stubs
) -> None:
    stubs.model_attempts = 3  # each call needed two retries
    stubs.answers = [[tool("get_order", f"h{n}")] for n in range(MAX_MODEL_CALLS)]
    async with turn(env, stubs) as handle:
        await handle.result()
    calls = stubs.inputs("call_model")
    assert len(calls) * 3 >= MAX_MODEL_CALLS > (len(calls) - 1) * 3
    [final] = stubs.inputs("finalize")
    assert final.override_text == BOUNDS_TEXT


async def test_the_confirmation_path_counts_and_never_exceeds_the_cap(
    env: WorkflowEnvironment, stubs: Stubs
) -> None:
    # Every request took two attempts: the model asks for the confirmation with the turn's
    # last request, so nothing is left to word the outcome and code says it.
    stubs.model_attempts = 2
    stubs.answers = [[tool("get_order", "h0")], [tool("get_order", "h1")]]
    stubs.answers += [[tool("propose_email", "h_email")], [], []]
    async with turn(env, stubs) as handle:
        await decide(handle, stubs, "confirmed")
        await handle.result()
    assert len(stubs.inputs("call_model")) * 2 == MAX_MODEL_CALLS
    assert stubs.names().count("send_email") == 1
    [final] = stubs.inputs("finalize")
    assert final.override_text == SENT_TEXT


async def test_a_proposal_at_the_loops_cap_is_refused_and_no_card_is_shown(
    env: WorkflowEnvironment, stubs: Stubs
) -> None:
    # The proposal comes with the loop's last request: running it would leave no request to
    # ask for the confirmation and word the outcome, so it is refused and the turn re-answers.
    reads = [[tool("get_order", f"h{n}")] for n in range(MAX_MODEL_CALLS - 2)]
    stubs.answers = [*reads, [tool("propose_email", "h_email")], []]
    async with turn(env, stubs) as handle:
        await handle.result()
    assert len(stubs.inputs("call_model")) == MAX_MODEL_CALLS
    assert stubs.inputs("execute_tool")[-1].refuse == "turn budget spent"
    assert "request_confirmation" not in stubs.names()
    assert "send_email" not in stubs.names()
    [final] = stubs.inputs("finalize")
    assert (final.model_call_id, final.override_text) == (f"mc_{MAX_MODEL_CALLS - 1}", None)


def test_stub_answers_are_plain_once_spent() -> None:
    # Guards the scripts above: a spent script answers plainly, so turns end.
    assert unavailable().type == "unavailable"
