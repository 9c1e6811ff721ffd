"""A hand-off's event log: what the customer's page and the agent's follow while the case is
open (api/case_stream.py). Each case counts its own ids on its row (`last_event_id`, moved by
the append's UPDATE, which locks it), as a turn does, and every append rings the event log's
doorbell (store/events.py `ring_log`) with the case's id. Internal notes never come here.
Nothing here commits (see `store`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from parley.handoffs import ENDED_STATUSES, HANDOFF_EVENT_DATA, HandoffEventType
from parley.store.db import Db
from parley.store.events import StoredEvent, ring_log


async def append_event(db: Db, *, handoff_id: str, data: BaseModel) -> int:
    """Append one event to the case's log (its id from the case's counter, which the UPDATE
    locks) and ring the doorbell; heard at the commit. Returns the event's id."""
    kind = _kind_of(data)
    payload = [{"type": kind.value, "data": data.model_dump(mode="json")}]
    params = {"id": handoff_id, "events": json.dumps(payload)}
    event_id = await db.value(_APPEND, params)
    assert event_id is not None, f"hand-off {handoff_id} is missing"
    await ring_log(db, log_id=handoff_id, first_id=int(event_id), events=payload)
    return int(event_id)


def _kind_of(data: BaseModel) -> HandoffEventType:
    for kind, model in HANDOFF_EVENT_DATA.items():
        if type(data) is model:
            return HandoffEventType(kind)
    raise TypeError(f"{type(data).__name__} is no hand-off event")


_APPEND = """
    WITH counter AS (
        UPDATE handoffs SET last_event_id = last_event_id + 1 WHERE id = %(id)s
        RETURNING last_event_id
    ), inserted AS (
        INSERT INTO handoff_events (handoff_id, id, type, data)
        SELECT %(id)s, counter.last_event_id, e.value ->> 'type', e.value -> 'data'
        FROM counter, jsonb_array_elements(CAST(%(events)s AS jsonb)) AS e(value)
        RETURNING id
    )
    SELECT id FROM inserted
"""


@dataclass(frozen=True)
class CaseLogRead:
    events: list[StoredEvent]
    ended: bool  # the case ended and nothing is left after these events


async def read_log(db: Db, *, handoff_id: str, after: int, limit: int = 500) -> CaseLogRead:
    """The case's events after `after`, and whether it has ended, from one snapshot."""
    params = {"id": handoff_id, "after": after, "limit": limit}
    rows = await db.rows(_READ, params, _LogRow)
    if not rows:
        return CaseLogRead([], True)
    events = [StoredEvent(r.id, r.type, r.data) for r in rows if r.id is not None]
    last_sent = events[-1].id if events else after
    case = rows[0]
    return CaseLogRead(events, case.status in ENDED_STATUSES and last_sent >= case.last_event_id)


@dataclass(frozen=True)
class _LogRow:
    status: str
    last_event_id: int
    id: int | None
    type: Any
    data: Any


_READ = """
    SELECT h.status, h.last_event_id, e.id, e.type, e.data
    FROM handoffs AS h LEFT JOIN LATERAL (
        SELECT id, type, data FROM handoff_events
        WHERE handoff_id = h.id AND id > %(after)s ORDER BY id LIMIT %(limit)s
    ) AS e ON true
    WHERE h.id = %(id)s
    ORDER BY e.id
"""
