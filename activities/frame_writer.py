"""One writer per worker for the frames its streaming steps append.

A streaming step (activities/turn.py `_stream`) hands each frame to the worker's writer and
waits for it to be committed; it holds no database connection while the model streams. The
writer appends the frames of every step that has one waiting in one statement
(store/events.py `append_frames`): while one flush is in flight the next frames gather, so a
quiet worker writes each frame at once and a busy one writes many turns in a commit. A busy
writer also spaces its flushes (`spacing_s`, half a frame: activities/frames.py) so that
more frames share each commit, and keeps its connection from one flush to the next
for as long as frames keep coming (one connection per worker, none per stream), giving it
back when nothing waits. Each step learns from its flush what `append_streamed` told it: the
id, and whether the turn's Stop is recorded or a steer came in.

The wake-up of the streams is rung once a flush for the turns that moved (store/events.py
`ring_turns`), in a statement of its own on the flush's connection right after its commit,
never inside a delta's commit. The log stays the truth: a ring that is lost (the worker dies
between the commit and the ring, the statement fails) costs the streams of those turns one
poll of the log, never an event (api/streaming.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from parley.contracts import EventType
from parley.store import events
from parley.store.db import Database, Db, connect
from parley.store.events import Appended, Frame
from parley.wire import DeltaData

log = logging.getLogger(__name__)

# Frames in one flush at most: the statement's JSON stays small, and a flush commits fast.
FLUSH_MAX = 256


@dataclass
class _Waiting:
    turn_id: str
    data: DeltaData
    written: asyncio.Future[Appended]


@dataclass
class _Loop:
    """The writer's work in one event loop (a test's loop ends; the worker's lives on): the
    frames waiting, and the task flushing them, which runs while there is something to do
    and ends when there is not."""

    loop: asyncio.AbstractEventLoop
    frames: list[_Waiting] = field(default_factory=list)
    writing: asyncio.Task[None] | None = None


class FrameWriter:
    def __init__(self, sessions: Database, spacing_s: Callable[[], float] = lambda: 0.0) -> None:
        self._sessions = sessions
        # A flush starts at least this long after the one before it began (0: at once).
        self._spacing_s = spacing_s
        self._running: _Loop | None = None

    async def append(self, turn_id: str, data: DeltaData) -> Appended:
        """Append one `delta` to the turn's log with the next flush; what the flush learned
        of the turn once it has committed. Raises what the flush raised, and `LookupError`
        for a turn that does not exist."""
        loop = asyncio.get_running_loop()
        running = self._running
        if running is None or running.loop is not loop:
            running = self._running = _Loop(loop)
        waiting = _Waiting(turn_id, data, loop.create_future())
        running.frames.append(waiting)
        if running.writing is None or running.writing.done():
            running.writing = loop.create_task(self._write(running))
        return await waiting.written

    async def _write(self, running: _Loop) -> None:
        """Flush until no frame waits (the frames that came during a flush go in the next),
        on one connection while the flushes succeed (a failed one's may be broken: the next
        flush takes another). When frames came in during a flush, the writer waits out the
        spacing before the next: the frames that come meanwhile join it, on the same
        connection. When none did, it stops at once, so the next frame (a new turn's first
        delta, a turn's `done`) is written the moment it comes, not a half frame later."""
        while running.frames:
            async with connect(self._sessions) as conn:
                while running.frames:
                    began = running.loop.time()
                    if not await self._flush(conn, self._take(running)):
                        break
                    wait = began + self._spacing_s() - running.loop.time()
                    if wait > 0 and running.frames:  # busy: let more frames join the next
                        await asyncio.sleep(wait)

    @staticmethod
    def _take(running: _Loop) -> list[_Waiting]:
        """The next flush: one frame per turn (a turn's next frame waits for the one after),
        at most FLUSH_MAX."""
        batch: list[_Waiting] = []
        later: list[_Waiting] = []
        turns: set[str] = set()
        for waiting in running.frames:
            if waiting.written.done():
                continue  # its step was cancelled while it waited: nothing to write
            if waiting.turn_id in turns or len(batch) >= FLUSH_MAX:
                later.append(waiting)
            else:
                turns.add(waiting.turn_id)
                batch.append(waiting)
        running.frames = later
        return batch

    async def _flush(self, conn: Db, batch: list[_Waiting]) -> bool:
        """Append the batch and ring for it; whether that went through (a failure is each
        waiting step's exception)."""
        if not batch:
            return True
        frames = [Frame(w.turn_id, [(EventType.delta, w.data)]) for w in batch]
        try:
            # Autocommit: the append is one statement, one commit; the ring is the next one.
            written = await events.append_frames(conn, frames)
        except Exception as exc:
            for waiting in batch:
                if not waiting.written.done():
                    waiting.written.set_exception(exc)
            return False
        await self._ring(conn, _settle(batch, frames, written))
        return True

    @staticmethod
    async def _ring(conn: Db, lines: list[str]) -> None:
        try:
            await events.ring_turns(conn, lines)
        except Exception:
            # The streams of these turns read the log at their next poll.
            log.warning("could not ring for %d turns", len(lines), exc_info=True)


def _settle(batch: list[_Waiting], frames: list[Frame], written: dict[str, Appended]) -> list[str]:
    """Tell each step what its flush learned; the ring's line of each turn that moved."""
    lines = []
    for waiting, frame in zip(batch, frames, strict=True):
        appended = written.get(waiting.turn_id)
        if appended is not None:
            first = appended.event_id - len(frame.events) + 1
            lines.append(events.turn_ring(frame.turn_id, first, frame.events))
        if waiting.written.done():
            continue  # its step was cancelled meanwhile
        if appended is None:
            waiting.written.set_exception(LookupError(f"turn {waiting.turn_id} does not exist"))
        else:
            waiting.written.set_result(appended)
    return lines
