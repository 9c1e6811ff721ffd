"""Pure pieces: the context packer, delta coalescing, the demo model, ids."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from parley.activities import tracing
from parley.activities.frames import coalesce
from parley.context import WindowMessage
from parley.contracts import EventType
from parley.gateway.base import Finish, ModelRequest, TextDelta
from parley.gateway.demo import DemoModel, compose_reply, tokenize
from parley.ids import message_id_for_call
from parley.store.events import _wire
from parley.window import choose_window, group_turns, render_turn
from parley.wire import ToolData


def _rendered(
    window: list[WindowMessage], recent_tokens: int = 10_000, summary_through: int = 0
) -> list[str]:
    chosen = choose_window(
        group_turns(window), recent_tokens=recent_tokens, summary_through=summary_through
    )
    return [
        m["content"]
        for turn in chosen.turns
        for m in render_turn(turn, aged=False, max_message_tokens=1000, cut=lambda t, n: t)
    ]


def test_window_keeps_the_newest_turns_in_seq_order() -> None:
    window = [
        WindowMessage(seq, "user" if seq % 2 else "assistant", f"m{seq}", "complete", tokens=10)
        for seq in range(10, 0, -1)
    ]
    # Each turn (a user message and its answer) costs 2 x (10 + framing) = 28 tokens; the
    # summary covers everything before them.
    assert _rendered(window, recent_tokens=60, summary_through=6) == ["m7", "m8", "m9", "m10"]


def test_window_drops_retracted_text_and_marks_unfinished_answers() -> None:
    window = [
        WindowMessage(1, "user", "hi", "complete"),
        WindowMessage(2, "assistant", "unsafe words", "retracted"),
        WindowMessage(3, "user", "again", "complete"),
        WindowMessage(4, "assistant", "half an ans", "incomplete"),
    ]
    contents = _rendered(window)
    assert "unsafe words" not in contents
    assert contents[-1].startswith("half an ans") and "incomplete" in contents[-1]


async def _timed(tokens: list[str], gap_s: float) -> AsyncIterator[TextDelta | Finish]:
    for token in tokens:
        await asyncio.sleep(gap_s)
        yield TextDelta(token)
    yield Finish("stop")


async def test_coalescing_sends_the_first_token_alone_then_joins_frames() -> None:
    tokens = [f"t{i} " for i in range(40)]
    frames = [f async for f in coalesce(_timed(tokens, 0.002), lambda: 0.03)]
    texts = [f for f in frames if isinstance(f, str)]
    assert texts[0] == "t0 "
    assert "".join(texts) == "".join(tokens)  # nothing lost, nothing repeated
    assert len(texts) < len(tokens) / 3  # tokens 2 ms apart, frames 30 ms: far fewer frames
    assert isinstance(frames[-1], Finish)


async def test_coalescing_with_zero_frame_passes_every_token() -> None:
    tokens = ["a", "b", "c"]
    frames = [f async for f in coalesce(_timed(tokens, 0), lambda: 0)]
    assert frames[:3] == tokens


async def test_demo_model_is_deterministic_and_counts_tokens() -> None:
    request = ModelRequest(
        model="demo-1",
        messages=[{"role": "system", "content": "s"}, {"role": "user", "content": "Hi there"}],
    )
    model = DemoModel(token_delay_s=0)
    first = "".join([e.text async for e in model.stream(request) if isinstance(e, TextDelta)])
    second = "".join([e.text async for e in model.stream(request) if isinstance(e, TextDelta)])
    assert first == second == compose_reply(request).text
    assert first  # it answers something
    assert model.tokens_emitted == 2 * len(tokenize(first))


def test_assistant_message_id_is_derived_from_the_model_call() -> None:
    assert message_id_for_call("mc_abc") == message_id_for_call("mc_abc") == "msg_abc"
    assert message_id_for_call("mc_abc") != message_id_for_call("mc_abd")


def test_an_event_is_stored_as_its_wire_model_and_a_mismatched_model_is_refused() -> None:
    start = ToolData(call_id="c1", name="get_order", phase="start", label="Looking…")
    assert _wire(EventType.tool, start) == {
        "call_id": "c1",
        "name": "get_order",
        "phase": "start",
        "label": "Looking…",
    }  # `status` only on `end`, as the contract says
    end = ToolData(call_id="c1", name="get_order", phase="end", label="Looking…", status="ok")
    assert _wire(EventType.tool, end)["status"] == "ok"
    with pytest.raises(TypeError):
        _wire(EventType.warning, start)


def test_annotate_outside_a_traced_activity_does_nothing() -> None:
    tracing.annotate(model="m")  # a test calling an activity method directly has no span


def test_the_demo_model_hands_off_when_asked_for_a_person_not_when_one_is_mentioned() -> None:
    def handoff(text: str) -> bool:
        request = ModelRequest(
            model="demo-1",
            messages=[{"role": "system", "content": "s"}, {"role": "user", "content": text}],
            tools=[{"name": "handoff_to_human", "description": "", "input_schema": {}}],
        )
        return [c.name for c in compose_reply(request).tool_calls] == ["handoff_to_human"]

    assert handoff("I want to talk to a person")
    assert handoff("Can I speak with an agent about order 8472?")
    assert handoff("Could a representative help me?")
    # A long chat typed or brought in mentions people and agents all the time.
    assert not handoff("Wow, my agent found me this awesome place, so thankful!")
    assert not handoff("You're such a caring person, and I talked to a person there too.")
