"""How a model's stream becomes the frames a streaming step appends (activities/turn.py).

A frame is what one `delta` event carries: the text that came in since the last one. Every
frame costs the same whatever its length (the worker's write and its wake-up ring, a row of
the log, the API's read and its SSE frame), while every token read off the network costs a
socket read; so the step writes frames, not tokens, and reads the network once a frame.

- **Frame length.** `PARLEY_STREAM_FRAME_MS` (40 ms) while the worker streams few answers.
  When it streams many at once, each stream's frames grow so that the worker writes about
  `PARLEY_STREAM_FRAMES_PER_S` frames a second in all, up to `PARLEY_STREAM_FRAME_MAX_MS`:
  the text still comes at the model's pace, in fewer, longer frames. The first token always
  goes out at once.
- **Reading once a frame.** A provider whose answer comes over the network keeps sending
  while nobody reads it (the socket's buffer holds it: `gateway.base.reads_ahead`), so after
  a frame the step reads nothing until the next frame is due, and then takes in one read all
  that came meanwhile. A model made in this process (the demo model, a test's fake) makes
  its next token only when asked: it is read as fast as it answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterator

from parley.config import Settings
from parley.gateway.base import Finish, TextDelta, ToolCallRequest

# A read that took longer than this waited for the network: whatever was already read is
# used up (a burst of already-received events comes back in microseconds).
WAITED_S = 0.002
# A busy worker's writer flushes about this many times a frame (`FrameClock.flush_spacing_s`).
FLUSHES_PER_FRAME = 2


class FrameClock:
    """One per worker: how many answers it streams now, and so how long their frames are."""

    def __init__(self, settings: Settings) -> None:
        self._base_s = settings.stream_frame_ms / 1000
        self._max_s = max(self._base_s, settings.stream_frame_max_ms / 1000)
        self._per_s = settings.stream_frames_per_s
        self.streams = 0

    def frame_s(self) -> float:
        return min(self._max_s, max(self._base_s, self.streams / self._per_s))

    def flush_spacing_s(self) -> float:
        """How far apart the worker's writer starts its flushes while frames keep waiting
        (activities/frame_writer.py): half a frame, so each stream's frame waits at
        most that long to be written, and a flush takes the frames of about half of the
        streams (one commit, not one a frame)."""
        return self.frame_s() / FLUSHES_PER_FRAME

    @contextlib.contextmanager
    def streaming(self) -> Iterator[None]:
        """Count one stream for as long as the block runs."""
        self.streams += 1
        try:
            yield
        finally:
            self.streams -= 1


async def coalesce(
    stream: AsyncIterator[TextDelta | ToolCallRequest | Finish],
    frame_s: Callable[[], float],
    *,
    reads_ahead: bool = False,
) -> AsyncGenerator[str | ToolCallRequest | Finish, None]:
    """Join text deltas into frames at least `frame_s()` apart; the first token goes out at
    once. Tool calls and the finish pass through after any buffered text. If the stream
    breaks, the text already received is yielded before the error: the user has seen it.

    With `reads_ahead`, the stream is not read again until the next frame is due, and a due
    frame goes out when what was read is used up (the next read had to wait), so it holds
    everything that came in one read."""
    buffer: list[str] = []
    due = float("-inf")  # when the next frame may go out
    try:
        while True:
            asked = time.monotonic()
            try:
                event = await anext(stream)
            except StopAsyncIteration:
                break
            now = time.monotonic()
            if not isinstance(event, TextDelta):
                if buffer:
                    yield "".join(buffer)
                    buffer.clear()
                yield event
                continue
            buffer.append(event.text)
            if now < due:
                continue
            # Due. Read ahead, a frame waits for the end of what one read brought (the read
            # that waited), unless that runs a whole frame past its time (a fast provider).
            if reads_ahead and now - asked < WAITED_S and now < due + frame_s():
                continue
            yield "".join(buffer)
            buffer.clear()
            due = now + frame_s()
            if (
                reads_ahead
            ):  # what comes meanwhile waits in the socket (not if the write took that long)
                await asyncio.sleep(due - time.monotonic())
    except Exception:
        if buffer:
            yield "".join(buffer)
        raise
    if buffer:
        yield "".join(buffer)
