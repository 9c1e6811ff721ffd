"""Live event streams: one LISTEN connection per API process wakes every open stream.

The durable log in `turn_events` is the truth; NOTIFY is only a doorbell. A stream reads the
log after its last id, sends what it finds, and sleeps until the doorbell rings for its turn
(or a short poll interval passes, which covers notifications lost while reconnecting). So any
API process can serve any turn, and a reconnect with `Last-Event-ID` misses nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections import defaultdict
from collections.abc import AsyncIterator, Iterator

import psycopg
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from sse_starlette import ServerSentEvent

from api.metrics import EVENTS_SENT
from parley.contracts import TERMINAL_EVENTS, EventType
from store.events import NOTIFY_CHANNEL, read_events

log = logging.getLogger(__name__)

POLL_INTERVAL_S = 1.0


class EventHub:
    def __init__(self, conninfo: str) -> None:
        self._conninfo = conninfo
        self._waiters: dict[str, set[asyncio.Event]] = defaultdict(set)
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._listen_forever())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    @contextlib.contextmanager
    def subscribe(self, turn_id: str) -> Iterator[asyncio.Event]:
        event = asyncio.Event()
        self._waiters[turn_id].add(event)
        try:
            yield event
        finally:
            waiters = self._waiters.get(turn_id)
            if waiters is not None:
                waiters.discard(event)
                if not waiters:
                    del self._waiters[turn_id]

    def _ring(self, turn_id: str) -> None:
        for event in self._waiters.get(turn_id, ()):
            event.set()

    async def _listen_forever(self) -> None:
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(
                    self._conninfo, autocommit=True
                ) as conn:
                    await conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
                    # Anything committed while we were not listening is picked up by polls.
                    for waiters in list(self._waiters.values()):
                        for event in waiters:
                            event.set()
                    async for note in conn.notifies():
                        self._ring(note.payload.partition(":")[0])
            except asyncio.CancelledError:
                raise
            except Exception:
                log.warning("event listener lost its connection; reconnecting", exc_info=True)
                await asyncio.sleep(1.0)


async def turn_event_stream(
    *,
    hub: EventHub,
    sessions: async_sessionmaker[AsyncSession],
    turn_id: str,
    after: int,
) -> AsyncIterator[ServerSentEvent]:
    """Replay the log after `after`, then follow it live until a terminal event."""
    with hub.subscribe(turn_id) as doorbell:
        while True:
            doorbell.clear()  # cleared before reading, so a ring during the read is kept
            async with sessions() as db:
                events = await read_events(db, turn_id=turn_id, after=after)
            for event in events:
                after = event.id
                EVENTS_SENT.inc()
                yield ServerSentEvent(
                    id=str(event.id),
                    event=event.type,
                    data=json.dumps(event.data, separators=(",", ":")),
                )
                if event.type in TERMINAL_EVENTS:
                    return
            if events and events[-1].type == EventType.confirmation_required:
                return  # the turn rests; its stream resumes once the action is resolved
            if not events:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(doorbell.wait(), timeout=POLL_INTERVAL_S)
