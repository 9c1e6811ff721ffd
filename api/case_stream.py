"""A hand-off's event stream (store/handoffs.py): the case's log replayed after the client's
last id, then followed live until the case ends.

It rides the turn streams' machinery: the API's one listener (`EventHub`) rings a doorbell
keyed by the case's id (case and turn ids never collide), and the log is the truth. A case
moves at a person's pace, so every ring reads the log; there is no batch to take from it.
Each stream holds one of its caller's stream leases while it lasts (api/routes/handoffs.py,
`StreamRegistry.reserve_case`), like a turn's or a session's stream.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

from sse_starlette import ServerSentEvent

from parley.api.streaming import LISTENING_POLL_S, POLL_INTERVAL_S, EventHub
from parley.store import handoff_events
from parley.store.db import Database, connect


async def case_event_stream(
    *, hub: EventHub, sessions: Database, handoff_id: str, after: int
) -> AsyncIterator[ServerSentEvent]:
    """The case's frames after `after`, until the case has ended and all of its log is sent."""
    with hub.subscribe(handoff_id) as doorbell:
        while True:
            doorbell.clear()  # before the read, so a ring during it is kept
            async with connect(sessions) as conn:
                read = await handoff_events.read_log(conn, handoff_id=handoff_id, after=after)
            for event in read.events:
                data = json.dumps(event.data, separators=(",", ":"))
                yield ServerSentEvent(id=str(event.id), event=event.type, data=data)
                after = event.id
            if read.ended:
                return
            if read.events:
                continue  # a full read may have left more
            poll_s = LISTENING_POLL_S if hub.listening.is_set() else POLL_INTERVAL_S
            try:
                async with asyncio.timeout(poll_s):
                    await doorbell.wait()
            except TimeoutError:
                pass
