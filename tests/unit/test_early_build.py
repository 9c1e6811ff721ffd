"""A posted turn's first build, begun on the ring that starts the turn (activities/early_build.py):
the first step takes it from memory instead of building again; anything else builds."""

from __future__ import annotations

import asyncio
from typing import Any, cast

from parley.activities import tracing
from parley.activities.context import ContextBuilder
from parley.activities.early_build import EarlyBuilds
from parley.contracts import BuildContextInput, BuildContextResult


class Builder:
    """Stands in for the context builder: counts its builds, annotates as the real one does."""

    def __init__(self, *, fails: bool = False) -> None:
        self.built: list[BuildContextInput] = []
        self.fails = fails

    async def build(self, inp: BuildContextInput) -> BuildContextResult:
        self.built.append(inp)
        tracing.annotate(recall="skipped")
        if self.fails and len(self.built) == 1:
            raise RuntimeError("the database went away")
        return BuildContextResult(f"call-{inp.turn_id}-{inp.step}-{len(self.built)}")


def early_for(builder: Builder) -> tuple[EarlyBuilds, ContextBuilder]:
    early, context = EarlyBuilds(), cast(ContextBuilder, builder)
    early.attach(context)
    return early, context


async def test_the_first_step_takes_the_build_begun_on_the_ring() -> None:
    builder = Builder()
    early, context = early_for(builder)
    early.begin("trn_1")
    early.begin("trn_1")  # a second ring for the same turn begins nothing more
    attrs: dict[str, Any] = {}
    token = tracing._current_attrs.set(attrs)  # the step's span, as the interceptor sets it
    try:
        result = await early.first(context, BuildContextInput("trn_1"))
    finally:
        tracing._current_attrs.reset(token)
    assert result.model_call_id == "call-trn_1-0-1"
    assert len(builder.built) == 1, "built once, on the ring"
    assert attrs == {"recall": "skipped"}, "the early build's annotations reach the step's span"
    # Taken once: a retry of the step builds (and finds the stored request, in the real one).
    again = await early.first(context, BuildContextInput("trn_1"))
    assert again.model_call_id == "call-trn_1-0-2"


async def test_a_failed_early_build_is_built_again_by_the_step() -> None:
    builder = Builder(fails=True)
    early, context = early_for(builder)
    early.begin("trn_2")
    result = await early.first(context, BuildContextInput("trn_2"))
    assert result.model_call_id == "call-trn_2-0-2"


async def test_later_steps_and_turns_begun_nowhere_build_as_always() -> None:
    builder = Builder()
    early, context = early_for(builder)
    early.begin("trn_3")
    await asyncio.sleep(0)
    later = await early.first(context, BuildContextInput("trn_3", step=1))
    other = await early.first(context, BuildContextInput("trn_4"))
    assert [b.step for b in builder.built][-2:] == [1, 0]
    assert later.model_call_id.startswith("call-trn_3-1") and other.model_call_id.startswith(
        "call-trn_4-0"
    )
