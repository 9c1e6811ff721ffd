"""The turn workflow alone: stub activities under the real names on the time-skipping test
server. Bounds, fallback, confirmation expiry, decline, supersede, screens and cancel at each
step, in milliseconds: timers are skipped, and a test acts at a step by holding that step's
stub until it has acted (no sleeps).

The full-stack tests prove the wiring; these prove the orchestration.
"""

from __future__ import annotations

import asyncio

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment

from parley.contracts import (
    MAX_MODEL_CALLS,
    CallModelInput,
    ScreenResult,
    TurnOutcome,
    TurnState,
)
from parley.screens import DECLINE_TEXT, RETRACTION_TEXT
from parley.workflows.turn import BOUNDS_TEXT, EXPIRED_TEXT, TurnWorkflow
from tests.support.time_skipping import (
    STEP_DEADLINE_S,
    STOP_HEARD_SOONER,
    decide,
    ends_cancelled,
    primary_down,
    proposing,
    reached,
    replays,
    turn,
    waiting_for_confirmation,
)
from tests.support.workflow_stubs import ACTION_ID, ModelAnswer, Stubs, tool, unavailable

# --- a plain turn, bounds and refusals -------------------------------------------------------


async def test_a_plain_turn_is_screened_answered_and_finalized(
    env: WorkflowEnvironment, stubs: Stubs
) -> None:
    async with turn(env, stubs) as handle:
        assert await handle.result() == TurnOutcome("completed", "msg_mc_0")
    assert stubs.names()[-1] == "finalize"
    assert {"screen_input", "judge_output", "offer_followups"} <= set(stubs.names())
    [final] = stubs.inputs("finalize")
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
    assert stubs.names()[-1] == "finalize"
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
    [final] = stubs.inputs("finalize")
    assert (final.model_call_id, final.override_text) == (f"mc_{MAX_MODEL_CALLS - 1}", None)
    assert "judge_output" in stubs.names()


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
    [final] = stubs.inputs("finalize")
    assert (final.outcome, final.override_text) == ("completed", BOUNDS_TEXT)
    assert "judge_output" not in stubs.names()


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
    assert stubs.inputs("finalize")[0].override_text is None


# --- fallback --------------------------------------------------------------------------------


async def test_the_fallback_answers_once_the_primarys_retries_are_spent(
    env: WorkflowEnvironment, stubs: Stubs
) -> None:
    stubs.model = primary_down
    async with turn(env, stubs, fallback=True) as handle:
        assert await handle.result() == TurnOutcome("completed", "msg_mc_0")
        await replays(handle, "_fallback")
    calls = stubs.inputs("call_model")
    assert [c.fallback for c in calls] == [False] * 5 + [True]
    assert stubs.inputs("finalize")[0].outcome == "completed"


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
    [final] = stubs.inputs("finalize")
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
    assert stubs.inputs("finalize")[0].outcome == "completed"


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
    assert stubs.names().index("send_email") < stubs.names().index("finalize")
    assert stubs.inputs("finalize")[0].outcome == "completed"
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
    assert stubs.inputs("finalize")[0].outcome == "completed"


async def test_a_superseded_confirmation_ends_the_turn_quietly(
    env: WorkflowEnvironment, stubs: Stubs
) -> None:
    stubs.answers = proposing()
    async with turn(env, stubs) as handle:
        await decide(handle, stubs, "superseded")
        await handle.result()
    assert "send_email" not in stubs.names()
    assert len(stubs.inputs("call_model")) == 2
    [final] = stubs.inputs("finalize")
    assert (final.outcome, final.override_text) == ("superseded", None)


# --- screens ---------------------------------------------------------------------------------


async def test_a_declined_input_is_answered_by_code_and_the_model_never_called(
    env: WorkflowEnvironment, stubs: Stubs
) -> None:
    stubs.input_screen = ScreenResult(False, "blocked_term")
    async with turn(env, stubs) as handle:
        await handle.result()
    assert "call_model" not in stubs.names()
    [final] = stubs.inputs("finalize")
    assert (final.override_text, final.retract) == (DECLINE_TEXT, False)


async def test_a_declined_answer_is_retracted(env: WorkflowEnvironment, stubs: Stubs) -> None:
    stubs.output_screen = ScreenResult(False, "blocked_term")
    stubs.hold = {"offer_followups"}  # still suggesting when the answer is withdrawn
    async with turn(env, stubs) as handle:
        await handle.result()
    [final] = stubs.inputs("finalize")
    assert (final.override_text, final.retract) == (RETRACTION_TEXT, True)
    assert "offer_followups" not in stubs.finished


async def test_an_input_screen_that_keeps_failing_fails_the_turn_closed(
    env: WorkflowEnvironment, stubs: Stubs
) -> None:
    stubs.errors["screen_input"] = ApplicationError("moderation unreachable")
    async with turn(env, stubs) as handle:
        await handle.result()
    assert stubs.names().count("screen_input") == 3  # the screen's attempts, then no more
    assert "call_model" not in stubs.names() and "finalize" not in stubs.names()
    assert [f.code for f in stubs.inputs("fail_turn")] == ["model_failed"]


async def test_an_output_screen_that_keeps_failing_lets_the_answer_stand(
    env: WorkflowEnvironment, stubs: Stubs
) -> None:
    stubs.errors["judge_output"] = ApplicationError("moderation unreachable")
    async with turn(env, stubs) as handle:
        await handle.result()
    [final] = stubs.inputs("finalize")
    assert (final.override_text, final.retract) == (None, False)


async def test_follow_ups_that_fail_or_take_too_long_never_hold_the_answer_back(
    env: WorkflowEnvironment, stubs: Stubs
) -> None:
    stubs.hold = {"offer_followups"}  # never released: dropped after their grace
    async with turn(env, stubs) as handle:
        assert await handle.result() == TurnOutcome("completed", "msg_mc_0")
    assert "offer_followups" not in stubs.finished  # cancelled, not waited for
    [final] = stubs.inputs("finalize")
    assert (final.override_text, final.retract) == (None, False)

    failing = Stubs()
    failing.errors["offer_followups"] = ApplicationError("suggestions unavailable")
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
    async with turn(env, stubs, task_timeout=STOP_HEARD_SOONER) as handle:
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
