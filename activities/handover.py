"""What one step of a turn read, handed to a step beside it on the same worker, so the second
does not read it again: the context build reads the user's message with its turn, and the
input screen, started with it in the turn's first workflow task, screens that text.

The handover lives in the worker's memory, never in workflow history (payloads stay ids), and
it is only a shortcut: a step that is handed nothing in time (the other step failed first or
runs elsewhere, or this is a retry) reads for itself, as it did before there was a handover.
A value is taken once and dropped soon after it was given, taken or not, so the worker keeps
a turn's text only for the few seconds its first task lasts."""

from __future__ import annotations

import asyncio
from typing import Generic, TypeVar

Value = TypeVar("Value")


class Handover(Generic[Value]):
    """A value per turn, given by one step (`give`) and taken once by another (`take`),
    whichever comes first."""

    # How long a given value waits for its taker before it is dropped.
    KEEP_S = 5.0

    def __init__(self) -> None:
        self._values: dict[str, asyncio.Future[Value | None]] = {}

    def give(self, turn_id: str, value: Value | None) -> None:
        """The turn's value as the giving step read it (None: it found none)."""
        waiting = self._values.get(turn_id)
        if waiting is None:
            waiting = self._values[turn_id] = asyncio.get_running_loop().create_future()
            asyncio.get_running_loop().call_later(self.KEEP_S, self._drop, turn_id, waiting)
        if not waiting.done():
            waiting.set_result(value)

    async def take(self, turn_id: str, *, within_s: float) -> Value | None:
        """The turn's value once it is given, or None when it is not given within
        `within_s` (or was given as None): the taker then reads for itself."""
        waiting = self._values.get(turn_id)
        if waiting is None:
            waiting = self._values[turn_id] = asyncio.get_running_loop().create_future()
        try:
            return await asyncio.wait_for(asyncio.shield(waiting), timeout=within_s)
        except TimeoutError:
            return None
        finally:
            self._drop(turn_id, waiting)

    def _drop(self, turn_id: str, waiting: asyncio.Future[Value | None]) -> None:
        if self._values.get(turn_id) is waiting:
            del self._values[turn_id]
