"""Every shape a turn can take, run to its end on the time-skipping server with stub
activities, and replayed from a history fetched after the workflow closed (so the last
workflow task, the one that completes the run, is replayed too).

`PARLEY_RECORD_HISTORY=turn_vN` writes each history to tests/histories/turn_vN_<shape>.json,
where tests/replay/test_replay.py replays it against every later version of the workflow.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import timedelta

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowFailureError
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment

from parley.contracts import MAX_MODEL_CALLS, ScreenResult, SteerInput
from parley.dispatch.outbox import WORKFLOW_TASK_TIMEOUT
from parley.workflows.turn import TurnWorkflow
from tests.support.histories import HISTORIES, SHAPES, replayer, scrub
from tests.support.time_skipping import (
    STEP_DEADLINE_S,
    STOP_HEARD_SOONER,
    Turn,
    decide,
    primary_down,
    proposing,
    reached,
    turn,
    waiting_for_confirmation,
)
from tests.support.workflow_stubs import STEERED, Stubs, tool

COMPLETED = EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED
CANCELED = EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CANCELED


@dataclass(frozen=True)
class Shape:
    # The script the stubs follow.
    prepare: Callable[[Stubs], None] = lambda stubs: None
    # What the user does while the turn runs.
    act: Callable[[Turn, Stubs], Awaitable[None]] | None = None
    fallback: bool = False
    ends: EventType.ValueType = COMPLETED
    # Steps the shape must have taken (so each history is the shape it is named after).
    ran: tuple[str, ...] = field(default=())
    skipped: tuple[str, ...] = field(default=())
    # The workflow task timeout the turn starts with (replay does not read it).
    task_timeout: timedelta = WORKFLOW_TASK_TIMEOUT


def script(**attrs: object) -> Callable[[Stubs], None]:
    def prepare(stubs: Stubs) -> None:
        for name, value in attrs.items():
            setattr(stubs, name, value() if callable(value) else value)

    return prepare


def deciding(decision: str) -> Callable[[Turn, Stubs], Awaitable[None]]:
    async def act(handle: Turn, stubs: Stubs) -> None:
        await decide(handle, stubs, decision)

    return act


async def stop_mid_answer(handle: Turn, stubs: Stubs) -> None:
    await reached(stubs, "call_model")
    await handle.cancel()


async def steer_mid_answer(handle: Turn, stubs: Stubs) -> None:
    """The user steers while the model streams: the turn takes the Update (recorded in its
    history) at its next workflow task, while the call still runs, and the call ends
    `steered` (its stream heard the store's doorbell)."""
    await reached(stubs, "call_model")
    taken = handle.execute_update(TurnWorkflow.steer, SteerInput("msg_s"))
    assert await asyncio.wait_for(taken, STEP_DEADLINE_S) == 1
    stubs.released["call_model"].set()


async def steer_on_the_card(handle: Turn, stubs: Stubs) -> None:
    """The user steers while the card waits: a step answers, the same card shows again, and
    the user confirms it."""
    await waiting_for_confirmation(handle)
    stubs.entered["request_confirmation"].clear()  # set again by the card shown again
    assert await handle.execute_update(TurnWorkflow.steer, SteerInput("msg_s", 5)) == 1
    await reached(stubs, "request_confirmation")
    await asyncio.wait_for(waiting_for_confirmation(handle), STEP_DEADLINE_S)
    await decide(handle, stubs, "confirmed")


def failing(stubs: Stubs) -> None:
    stubs.model = lambda inp: ApplicationError("refused", type="bad_request", non_retryable=True)


SHAPE_RUNS: dict[str, Shape] = {
    "plain": Shape(ran=("judge_output", "finalize"), skipped=("execute_tool",)),
    "tool": Shape(
        prepare=script(answers=lambda: [[tool("get_order", "h1")], []]),
        ran=("execute_tool", "finalize"),
    ),
    "confirmed": Shape(
        prepare=script(answers=proposing), act=deciding("confirmed"), ran=("send_email",)
    ),
    "declined": Shape(
        prepare=script(answers=proposing), act=deciding("declined"), skipped=("send_email",)
    ),
    "expired": Shape(
        prepare=script(answers=proposing), ran=("expire_action",), skipped=("send_email",)
    ),
    "superseded": Shape(
        prepare=script(answers=proposing), act=deciding("superseded"), skipped=("send_email",)
    ),
    "cancelled": Shape(
        prepare=script(hold={"call_model"}),
        act=stop_mid_answer,
        ends=CANCELED,
        task_timeout=STOP_HEARD_SOONER,
        ran=("cancel_turn",),
        skipped=("finalize",),
    ),
    "failed": Shape(prepare=failing, ran=("fail_turn",), skipped=("finalize",)),
    "clarification": Shape(
        prepare=script(clarification=True), ran=("finalize",), skipped=("call_model",)
    ),
    "fallback": Shape(prepare=script(model=lambda: primary_down), fallback=True),
    "retracted": Shape(
        # Still suggesting when the answer is withdrawn (the test server refuses to cancel
        # a step that has just finished, so the race is kept out of the recording).
        prepare=script(output_screen=ScreenResult(False, "blocked_term"), hold={"offer_followups"}),
        ran=("judge_output", "finalize"),
    ),
    # The tool loop hits its cap; a step without tools words the answer.
    "reanswer": Shape(
        prepare=script(
            answers=lambda: (
                [[tool("get_order", f"h{n}")] for n in range(MAX_MODEL_CALLS - 1)] + [[]]
            )
        ),
        ran=("execute_tool", "judge_output", "finalize"),
    ),
    # A steer while the model streams: the stream stops, the next step answers.
    "steered": Shape(
        prepare=script(answers=lambda: [STEERED, []], hold={"call_model"}, steer_at={1: 5}),
        act=steer_mid_answer,
        task_timeout=STOP_HEARD_SOONER,
        ran=("judge_output", "finalize"),
    ),
    # A steer while the card waits: answered without tools, the card kept, then confirmed.
    "steered_card": Shape(
        prepare=script(answers=proposing, steer_at={2: 5}),
        act=steer_on_the_card,
        ran=("send_email", "finalize"),
    ),
    # A steer as the answer ends: the ending refuses once, the model answers it.
    "steered_late": Shape(
        prepare=script(steered_endings=1, steer_at={1: 5}), ran=("judge_output", "finalize")
    ),
    # The input screen declines the steer: the turn ends with the decline, no model call more.
    "steer_declined": Shape(
        prepare=script(
            answers=lambda: [STEERED], steer_at={1: 5}, steer_screen=ScreenResult(False, "abuse")
        ),
        ran=("finalize",),
        skipped=("judge_output",),
    ),
}


def test_every_listed_shape_has_a_run() -> None:
    assert set(SHAPE_RUNS) == set(SHAPES)


@pytest.mark.parametrize("name", SHAPES)
async def test_each_shape_runs_to_its_close_and_replays(
    env: WorkflowEnvironment, name: str
) -> None:
    shape = SHAPE_RUNS[name]
    stubs = Stubs()
    shape.prepare(stubs)
    async with turn(env, stubs, fallback=shape.fallback, task_timeout=shape.task_timeout) as handle:
        if shape.act is not None:
            await shape.act(handle, stubs)
        if shape.ends == CANCELED:
            with pytest.raises(WorkflowFailureError):
                await handle.result()
        else:
            await handle.result()
        history = await handle.fetch_history()  # after the close: the last task included
    assert history.events[-1].event_type == shape.ends
    assert set(shape.ran) <= set(stubs.names()), stubs.names()
    assert not set(shape.skipped) & set(stubs.names()), stubs.names()
    if name == "fallback":
        assert [c.fallback for c in stubs.inputs("call_model")][-1] is True
    if name == "retracted":
        assert stubs.inputs("finalize")[0].retract is True
    if name == "reanswer":
        assert stubs.inputs("build_context")[-1].reanswer_of is not None
    if name.startswith("steer"):
        # Each steer screened once, when a step first took it.
        assert [s.steers_after for s in stubs.inputs("screen_input")] == [None, 0]
    if name == "steer_declined":
        assert len(stubs.inputs("call_model")) == 1
        assert stubs.inputs("finalize")[0].override_text is not None
    elif name == "steered_card":
        builds = stubs.inputs("build_context")
        assert [b.reanswer_of is not None for b in builds] == [False, False, True, False]
        cards = stubs.inputs("request_confirmation")
        assert [c.action_id for c in cards] == ["act_1", "act_1"]
        assert len(stubs.inputs("send_email")) == 1
    elif name.startswith("steered"):
        # The steer's step: built, called and ended once more, with no second turn.
        assert [i.step for i in stubs.inputs("build_context")] == [0, 1]
        assert len(stubs.inputs("call_model")) == 2
    await replayer(TurnWorkflow).replay_workflow(history)
    recording = os.environ.get("PARLEY_RECORD_HISTORY")
    if recording:
        (HISTORIES / f"{recording}_{name}.json").write_text(scrub(history.to_json()))
