"""How a streaming step hears the user's Stop while it runs.

The model call runs as a local activity of the turn's workflow task: a cancel request sent to
the workflow reaches it only at the next workflow task, seconds later. The Stop is recorded
on the turn's row first (`store.turns`), so the step watches the row instead: every delta's
append reads it in the same round trip (`store.events.append_streamed`), and while the
provider sends nothing (before its first token, or a long tool call's arguments) the row is
read every STOP_CHECK_S.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

from parley.store.db import Db
from parley.store.events import stop_is_recorded
from parley.store.turns import TurnStopped

# While the stream is quiet, the Stop is looked for this often: well under the time a user
# waits for a Stop to show, and a cheap read by primary key.
STOP_CHECK_S = 0.2

Item = TypeVar("Item")
StopCheck = Callable[[], Awaitable[bool]]


def stop_recorded(connection: Db, turn_id: str) -> StopCheck:
    """The check for one turn, on the stream's own connection (free between appends: the
    check runs only while no append is in flight)."""

    async def check() -> bool:
        return await stop_is_recorded(connection, turn_id=turn_id)

    return check


async def checking_while_quiet(
    items: AsyncIterator[Item], stopped: StopCheck, every_s: float, *, turn_id: str
) -> AsyncIterator[Item]:
    """`items` as they come; whenever none has come for `every_s`, the Stop is looked for,
    and once it is recorded the stream ends with `TurnStopped` (the pending read of `items`
    cancelled, so the provider stops generating)."""
    while True:
        pending = asyncio.ensure_future(anext(items))
        try:
            while not (await asyncio.wait([pending], timeout=every_s))[0]:
                if await stopped():
                    raise TurnStopped(turn_id, "cancelling")
        except BaseException:
            pending.cancel()
            await asyncio.wait([pending])
            raise
        try:
            item = pending.result()
        except StopAsyncIteration:
            return
        yield item
