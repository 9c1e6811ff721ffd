"""How a streaming step hears the user's Stop, or a steer, while it runs.

The model call runs as a local activity of the turn's workflow task: a cancel request or an
Update sent to the workflow reaches it only at the next workflow task, seconds later. The
Stop is recorded on the turn's row first (`store.turns`), and a steer rings the session's
doorbell when its message is stored (store/steering.py), so the step watches the rows
instead: every delta's append reads both in the same round trip (the worker's writer,
activities/frame_writer.py), and while the provider sends nothing (before its first
token, or a long tool call's arguments) they are read every STOP_CHECK_S.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import TypeVar

from parley.store.db import Database, connect
from parley.store.events import Heard, stop_or_steer
from parley.store.steering import is_newer
from parley.store.turns import TurnStopped

# While the stream is quiet, the Stop is looked for this often: well under the time a user
# waits for a Stop to show, and a cheap read by primary key.
STOP_CHECK_S = 0.2

Item = TypeVar("Item")


class Steered(Exception):
    """A steer newer than the step's request came in: the stream stops, and its partial text
    is kept as superseded (activities/turn.py)."""


class Watch:
    """What one streaming step listens for: the turn's Stop, and a steer newer than the one
    its request was built with (`seen`, the request's `steer_seq`)."""

    def __init__(self, sessions: Database, turn_id: str, seen: int | None) -> None:
        self._sessions = sessions  # a connection taken for each check, given straight back
        self._turn_id = turn_id
        self._seen = seen

    def heard(self, heard: Heard) -> None:
        """Raise `TurnStopped` for a recorded Stop (it wins), `Steered` for a newer steer."""
        if heard.stopped:
            raise TurnStopped(self._turn_id, "cancelling")
        if is_newer(heard.steer_seq, self._seen):
            raise Steered(self._turn_id)

    async def check(self) -> None:
        """The quiet check: read both, and raise as `heard` does."""
        async with connect(self._sessions) as conn:
            heard = await stop_or_steer(conn, turn_id=self._turn_id)
        self.heard(heard)


async def checking_while_quiet(
    items: AsyncIterator[Item], watch: Watch, every_s: float
) -> AsyncIterator[Item]:
    """`items` as they come; whenever none has come for `every_s`, the watch checks, and
    once it hears a Stop or a steer the stream ends with its exception (the pending read of
    `items` cancelled, so the provider stops generating)."""
    while True:
        pending = asyncio.ensure_future(anext(items))
        try:
            while not (await asyncio.wait([pending], timeout=every_s))[0]:
                await watch.check()
        except BaseException:
            pending.cancel()
            await asyncio.wait([pending])
            raise
        try:
            item = pending.result()
        except StopAsyncIteration:
            return
        yield item
