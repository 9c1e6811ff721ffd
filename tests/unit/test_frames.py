"""Frames of a streaming step (activities/frames.py): their length under load, and a network
provider read once a frame rather than once a token."""

from __future__ import annotations

import asyncio

import pytest

from parley.activities.frames import FrameClock, coalesce
from parley.config import Settings
from parley.gateway.base import Finish, TextDelta, reads_ahead
from parley.gateway.demo import DemoModel
from parley.gateway.openai_compat import OpenAICompatProvider


class Socket:
    """A provider's stream as the network brings it: events arrive on their own schedule
    whether anyone reads them or not; `waits` counts the reads that found nothing arrived
    (each a read off the network)."""

    def __init__(self, tokens: list[str], gap_s: float) -> None:
        self._arrived: asyncio.Queue[TextDelta | Finish] = asyncio.Queue()
        self._feeder = asyncio.create_task(self._feed(tokens, gap_s))
        self._ended = False
        self.waits = 0

    async def _feed(self, tokens: list[str], gap_s: float) -> None:
        for token in tokens:
            self._arrived.put_nowait(TextDelta(token))
            await asyncio.sleep(gap_s)
        self._arrived.put_nowait(Finish("stop"))

    def __aiter__(self) -> Socket:
        return self

    async def __anext__(self) -> TextDelta | Finish:
        if self._ended:
            raise StopAsyncIteration
        if self._arrived.empty():
            self.waits += 1
        event = await self._arrived.get()
        self._ended = isinstance(event, Finish)
        return event


async def test_a_network_stream_is_read_once_a_frame() -> None:
    tokens = [f"t{i} " for i in range(60)]
    socket = Socket(tokens, gap_s=0.004)
    frames = [f async for f in coalesce(socket, lambda: 0.04, reads_ahead=True)]
    texts = [f for f in frames if isinstance(f, str)]
    assert texts[0] == "t0 "  # the first token at once
    assert "".join(texts) == "".join(tokens)  # nothing lost, nothing repeated, in order
    assert isinstance(frames[-1], Finish)
    assert len(texts) < len(tokens) / 3
    # After a frame nothing is read until the next is due; then one read takes in what came,
    # and the read that has to wait ends the frame: about one read off the network a frame,
    # not one a token. (How many frames exactly depends on the loop's timing on a busy
    # machine, so the bound is the one that matters: far fewer reads than tokens.)
    assert socket.waits < len(tokens) / 3


async def test_a_model_in_this_process_is_read_as_fast_as_it_answers() -> None:
    """Without read-ahead every token is asked for at once: a model that makes its tokens
    when asked is not slowed by waiting for frames."""
    socket = Socket([f"t{i} " for i in range(20)], gap_s=0.004)
    frames = [f async for f in coalesce(socket, lambda: 0.04, reads_ahead=False)]
    assert "".join(f for f in frames if isinstance(f, str)) == "".join(f"t{i} " for i in range(20))
    assert socket.waits >= 15  # each token read when it came (a few may come together)


def test_frames_grow_with_the_streams_of_the_worker() -> None:
    clock = FrameClock(
        Settings(stream_frame_ms=40, stream_frame_max_ms=160, stream_frames_per_s=100)
    )
    lengths = {}
    for streams in (0, 1, 4, 10, 16, 40, 400):
        clock.streams = streams
        lengths[streams] = clock.frame_s()
    assert lengths == {0: 0.04, 1: 0.04, 4: 0.04, 10: 0.1, 16: 0.16, 40: 0.16, 400: 0.16}


def test_a_stream_is_counted_while_it_runs_even_when_it_fails() -> None:
    clock = FrameClock(Settings())
    with clock.streaming(), clock.streaming():
        assert clock.streams == 2
    with pytest.raises(RuntimeError), clock.streaming():
        raise RuntimeError("the provider broke")
    assert clock.streams == 0


def test_network_providers_read_ahead_and_the_demo_model_does_not() -> None:
    assert reads_ahead(OpenAICompatProvider(base_url="http://127.0.0.1:9/v1", api_key="k"))
    assert not reads_ahead(DemoModel(token_delay_s=0))
