"""A turn's event log read back: the events after an id, and whether the turn has ended
(every stream's read, api/streaming.py; store/events.py appends and rings)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from parley.contracts import TERMINAL_TURN_STATES
from parley.store.db import Db
from parley.store.events import StoredEvent
from parley.store.viewers import ATTACH_VIEWER_SQL


@dataclass(frozen=True)
class LogRead:
    """What a stream learns from one read of the log: the events after its last id, and
    whether the turn has ended with nothing left to send after them."""

    events: list[StoredEvent]
    ended: bool


async def read_log(
    conn: Db, *, turn_id: str, after: int, limit: int = 500, attach: bool = False
) -> LogRead:
    """The events after `after` and whether the turn has ended, from one statement: one
    snapshot, so an event committed between two reads is never taken for the end. A turn
    that does not exist has no events and has not ended. An ended turn whose read came back
    short has nothing more to give, even when it stops before the turn's last event: the
    retention purge deletes a turn's events and keeps the turn, and a reader resuming from
    before the purge would otherwise follow it for as long as it stays connected. With
    `attach`, the same statement counts the reader as a viewer of the turn
    (store/viewers.py); on a connection in autocommit (`store.db.connect`), that commits
    with it."""
    statement = _ATTACH_AND_READ if attach else _READ_WITH_END
    rows = await conn.rows(statement, {"turn_id": turn_id, "after": after, "limit": limit}, _LogRow)
    if not rows:
        return LogRead([], False)
    events = [StoredEvent(r.id, r.type, r.data) for r in rows if r.id is not None]
    last_sent = events[-1].id if events else after
    turn = rows[0]
    drained = last_sent >= turn.last_event_id or len(events) < limit
    return LogRead(events, turn.state in _TERMINAL and drained)


@dataclass(frozen=True)
class _LogRow:
    """One row of a read: the turn's state and counter beside each event. The event's columns
    are all None in the one row of a turn with nothing after `after` (the empty side of the
    join), which `read_log` drops by its id."""

    state: str
    last_event_id: int
    id: int | None
    type: Any
    data: Any


_TERMINAL = frozenset(state.value for state in TERMINAL_TURN_STATES)
# Plain SQL on psycopg's own connection: this runs at the start of every stream, at every poll
# and after every gap (the JSON comes back as Python objects, psycopg's default for jsonb).
_READ_WITH_END = """
    SELECT t.state, t.last_event_id, e.id, e.type, e.data
    FROM turns AS t LEFT JOIN LATERAL (
        SELECT id, type, data FROM turn_events
        WHERE turn_id = t.id AND id > %(after)s ORDER BY id LIMIT %(limit)s
    ) AS e ON true
    WHERE t.id = %(turn_id)s
    ORDER BY e.id
"""
# The UPDATE in the WITH runs whether or not it is read; the SELECT sees the turn as it was
# before it, which differs only in the viewer count.
_ATTACH_AND_READ = f"WITH attached AS ({ATTACH_VIEWER_SQL}) {_READ_WITH_END}"
