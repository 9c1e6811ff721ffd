"""A turn's first build begun beside its start (activities/early_build.py), as the opening
step takes it: the step's model call is given the early build's request and the step builds
nothing itself; a failed early build leaves the step to build; only the first step of a turn
takes one, and only once. The system tier runs it on the real stack
(tests/system/test_early_build.py)."""

from __future__ import annotations

import asyncio

import pytest

from parley.activities import tracing
from parley.activities.early_build import EarlyBuilds
from parley.activities.opening import StepOpening
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
    """The step's parts: every build is counted, and the step's own says so in its call id."""

    def __init__(self) -> None:
        self.built: list[BuildContextInput] = []
        self.called: list[str] = []

    async def build_context(self, inp: BuildContextInput) -> BuildContextResult:
        self.built.append(inp)
        return BuildContextResult(f"mc_step_{inp.step}")

    async def call_model(self, inp: CallModelInput) -> CallModelResult:
        self.called.append(inp.model_call_id)
        return CallModelResult(inp.model_call_id, "stop", 10, 3)

    async def screen_input(self, inp: ScreenInput) -> ScreenResult:
        return ScreenResult(True)


class EarlyBuild:
    """The build the early path runs: held until released, then answered or failed."""

    def __init__(self, *, fails: bool = False) -> None:
        self.fails = fails
        self.asked: list[BuildContextInput] = []
        self.release = asyncio.Event()

    async def __call__(self, inp: BuildContextInput) -> BuildContextResult:
        self.asked.append(inp)
        tracing.owners_read(session_id="ses_1", tenant_id="northwind")
        await self.release.wait()
        if self.fails:
            raise ConnectionError("the database went away")
        return BuildContextResult("mc_early")


def opening_with(build: EarlyBuild) -> tuple[StepOpening, Parts, EarlyBuilds]:
    parts = Parts()
    early = EarlyBuilds()
    early.attach(build)
    return StepOpening(turn=parts, screens=parts, early=early), parts, early


async def test_the_first_step_calls_the_model_with_the_build_begun_beside_the_start() -> None:
    build = EarlyBuild()
    step, parts, early = opening_with(build)
    early.begin("trn_1")
    opening = asyncio.ensure_future(step.open_step(OpenStepInput("trn_1", screen_input=True)))
    await asyncio.sleep(0)
    assert not opening.done()  # the step waits for the build under way, it does not build
    build.release.set()
    opened = await opening
    assert opened.built.model_call_id == "mc_early" and parts.called == ["mc_early"]
    assert parts.built == [] and build.asked == [BuildContextInput("trn_1")]


async def test_a_failed_early_build_leaves_the_step_to_build() -> None:
    build = EarlyBuild(fails=True)
    build.release.set()
    step, parts, early = opening_with(build)
    early.begin("trn_1")
    opened = await step.open_step(OpenStepInput("trn_1", screen_input=True))
    assert parts.called == ["mc_step_0"] and parts.built == [BuildContextInput("trn_1")]
    assert opened.call is not None


async def test_only_the_turn_s_first_step_takes_it_and_only_once() -> None:
    build = EarlyBuild()
    build.release.set()
    step, parts, early = opening_with(build)
    early.begin("trn_1")
    early.begin("trn_1")  # a second ring for the same turn begins nothing more
    await step.open_step(OpenStepInput("trn_1", step=1))
    await step.open_step(OpenStepInput("trn_1", reanswer_of="mc_3"))
    assert parts.called == ["mc_step_1", "mc_step_0"]
    await step.open_step(OpenStepInput("trn_1"))
    await step.open_step(OpenStepInput("trn_1"))  # a retry of the step: built by the step
    assert parts.called[2:] == ["mc_early", "mc_step_0"] and len(build.asked) == 1


async def test_nothing_begins_without_a_build_attached_and_another_turn_takes_none() -> None:
    early = EarlyBuilds()
    early.begin("trn_1")
    assert early.take(BuildContextInput("trn_1")) is None
    build = EarlyBuild()
    step, parts, attached = opening_with(build)
    attached.begin("trn_1")
    build.release.set()
    await step.open_step(OpenStepInput("trn_2"))
    assert parts.called == ["mc_step_0"]


async def test_a_build_nobody_takes_is_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(EarlyBuilds, "KEEP_S", 0.0)
    build = EarlyBuild()
    build.release.set()
    step, parts, early = opening_with(build)
    early.begin("trn_1")
    for _ in range(3):  # the drop runs on the loop's next turn (KEEP_S 0)
        await asyncio.sleep(0)
    assert early.take(BuildContextInput("trn_1")) is None


def test_the_early_build_s_span_and_owners_become_the_step_s() -> None:
    """What the build annotated and the owners it read, kept outside any step, are the
    running step's once it adopts them: a part span with the build's own times."""
    kept: list[tuple[str, str, dict[str, str], bool]] = []
    told: list[tuple[str, str]] = []
    record = tracing.Detached()
    with tracing.detached(record):
        tracing.annotate(recall="skipped")
        tracing.owners_read(session_id="ses_1", tenant_id="northwind")
    assert told == []  # nobody hears of them outside a step

    def keep(name: str, began: object, outcome: str, attrs: dict[str, str], ended: object) -> None:
        kept.append((name, outcome, attrs, began == record.started and ended == record.ended))

    keeper = tracing._part_keeper.set(keep)
    sink = tracing._owners_sink.set(lambda s, t: told.append((s, t)))
    try:
        tracing.adopt("build_context", record)
    finally:
        tracing._owners_sink.reset(sink)
        tracing._part_keeper.reset(keeper)
    assert kept == [("build_context", "ok", {"recall": "skipped"}, True)]
    assert told == [("ses_1", "northwind")]


async def test_a_burst_of_rings_begins_no_more_than_its_share_of_the_pool() -> None:
    """Past `AT_ONCE` early builds under way, a ring begins none: that turn's step builds,
    and the pool the worker sized for them is never outgrown by a burst of posts."""
    build = EarlyBuild()
    step, parts, early = opening_with(build)
    rung = [f"trn_{n}" for n in range(EarlyBuilds.AT_ONCE + 2)]
    for turn_id in rung:
        early.begin(turn_id)
    await asyncio.sleep(0)
    assert len(build.asked) == EarlyBuilds.AT_ONCE
    build.release.set()
    await step.open_step(OpenStepInput(rung[-1]))
    assert parts.called == ["mc_step_0"]  # past the share: built by its step
    await step.open_step(OpenStepInput(rung[0]))
    assert parts.called[-1] == "mc_early"
    early.begin("trn_later")  # the builds that ended gave their places back
    await asyncio.sleep(0)
    assert build.asked[-1] == BuildContextInput("trn_later")
