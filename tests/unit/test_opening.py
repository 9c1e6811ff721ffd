"""The opening step's own rules (activities/opening.py), over parts that answer from a script:
what reaches the model after the input screen and the steers' screen, and how a screen that
fails is retried, then fails the step for good. The workflow tier runs the same step over its
stubs in every turn shape (tests/support/workflow_stubs.py)."""

from __future__ import annotations

import asyncio

import pytest
from temporalio.exceptions import ApplicationError

from parley.activities import opening
from parley.activities.opening import SCREEN_FAILED, SCREEN_TRIES, StepOpening
from parley.contracts import (
    BuildContextInput,
    BuildContextResult,
    CallModelInput,
    CallModelResult,
    OpenStepInput,
    ScreenInput,
    ScreenResult,
)


class Parts:
    def __init__(self) -> None:
        self.called: list[CallModelInput] = []
        self.screened: list[ScreenInput] = []
        self.steer_seq: int | None = None
        self.clarification = False
        self.verdicts: list[ScreenResult | Exception] = []  # in order; then allowed

    async def build_context(self, inp: BuildContextInput) -> BuildContextResult:
        return BuildContextResult(f"mc_{inp.step}", self.clarification, self.steer_seq)

    async def call_model(self, inp: CallModelInput) -> CallModelResult:
        self.called.append(inp)
        return CallModelResult(inp.model_call_id, "stop", 10, 3)

    async def screen_input(self, inp: ScreenInput) -> ScreenResult:
        self.screened.append(inp)
        verdict = self.verdicts.pop(0) if self.verdicts else ScreenResult(True)
        if isinstance(verdict, Exception):
            raise verdict
        return verdict


@pytest.fixture(autouse=True)
def no_pause(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(opening, "SCREEN_RETRY_S", 0.0)


async def test_an_allowed_message_is_answered_by_the_step_s_model_call() -> None:
    parts = Parts()
    opened = await StepOpening(turn=parts, screens=parts).open_step(
        OpenStepInput("trn_1", screen_input=True)
    )
    assert opened.allowed and opened.call is not None
    assert [c.model_call_id for c in parts.called] == ["mc_0"]
    assert [s.steers_after for s in parts.screened] == [None]


async def test_a_declined_message_reaches_no_model() -> None:
    parts = Parts()
    parts.verdicts = [ScreenResult(False, "unsafe")]
    opened = await StepOpening(turn=parts, screens=parts).open_step(
        OpenStepInput("trn_1", screen_input=True)
    )
    assert (opened.allowed, opened.call, parts.called) == (False, None, [])


async def test_steers_the_build_took_past_the_screened_ones_are_screened_first() -> None:
    parts = Parts()
    parts.steer_seq = 7
    parts.verdicts = [ScreenResult(False, "unsafe")]
    opened = await StepOpening(turn=parts, screens=parts).open_step(
        OpenStepInput("trn_1", step=2, steers_screened=5)
    )
    assert opened.steer_declined and parts.called == []
    assert [s.steers_after for s in parts.screened] == [5]  # only those after seq 5

    # Steers already screened by an earlier step are not screened again.
    again = Parts()
    again.steer_seq = 5
    opened = await StepOpening(turn=again, screens=again).open_step(
        OpenStepInput("trn_1", step=3, steers_screened=5)
    )
    assert opened.call is not None and again.screened == []


async def test_code_that_asks_the_user_calls_no_model() -> None:
    parts = Parts()
    parts.clarification = True
    opened = await StepOpening(turn=parts, screens=parts).open_step(
        OpenStepInput("trn_1", screen_input=True)
    )
    assert opened.built.clarification and opened.call is None and parts.called == []


async def test_a_screen_that_fails_once_is_tried_again_within_the_step() -> None:
    parts = Parts()
    parts.verdicts = [RuntimeError("moderation timed out")]
    opened = await StepOpening(turn=parts, screens=parts).open_step(
        OpenStepInput("trn_1", screen_input=True)
    )
    assert opened.call is not None and len(parts.screened) == 2


async def test_a_screen_that_keeps_failing_fails_the_step_for_good_before_any_model() -> None:
    parts = Parts()
    parts.verdicts = [RuntimeError("moderation unreachable")] * SCREEN_TRIES
    with pytest.raises(ApplicationError) as failed:
        await StepOpening(turn=parts, screens=parts).open_step(
            OpenStepInput("trn_1", screen_input=True)
        )
    assert failed.value.type == SCREEN_FAILED and failed.value.non_retryable
    assert len(parts.screened) == SCREEN_TRIES and parts.called == []


async def test_a_build_that_fails_is_the_step_s_error_whatever_the_screen_said() -> None:
    class BrokenBuild(Parts):
        async def build_context(self, inp: BuildContextInput) -> BuildContextResult:
            await asyncio.sleep(0)  # the screen finishes (failing) first
            raise RuntimeError("build failed")

    parts = BrokenBuild()
    parts.verdicts = [ApplicationError("refused", non_retryable=True)]
    with pytest.raises(RuntimeError, match="build failed"):
        await StepOpening(turn=parts, screens=parts).open_step(
            OpenStepInput("trn_1", screen_input=True)
        )
    assert parts.called == []
