"""The session's own event log (`session_events`), what the session stream reads beside the
logs of the turns it announces (parley/live.py says what each holds, api/live.py how the
stream follows both).

A session event is numbered by the session row's counter (`sessions.last_event_id`), moved
in an UPDATE of that row: the row's lock orders them, and every writer of one already holds
it (a post, a queue, a retry, a deletion lock or update the session row anyway), so no
statement and no lock is added to any path. The doorbell is the turn events' channel
with the session's id as its key and no events (store/events.py `SESSION_DOORBELL`): a stream
that hears it reads this log.

This module owns the append. `announce` is the one-statement append for a writer that does
not otherwise write the session row; a statement that does composes `COUNTED` into its own
UPDATE of the session (which returns the row's `id` and `last_event_id`), `announced(cte)`
and `LIVE_RUNG` instead: store/turns/birth.py (a plain post), store/queue.py `queue_message`
(a queued post), store/turns/birth.py `open_turn` (a retry's turn) and `_join_turn` (a message
to a resting turn) and store/steering.py `join_as_steer` (a steer), both through `joining`,
and store/sessions.py `delete_session`. Every statement that gives birth to a turn announces it:
tests/unit/test_live.py holds that, so the session stream never misses a turn.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pydantic import BaseModel

from parley.live import SESSION_EVENT_DATA, SessionEventType
from parley.store.db import Db
from parley.store.events import SESSION_DOORBELL
from parley.store.messages import MESSAGE_AT_SEQ, MESSAGE_COLUMNS, MessageRow

# In the composer's UPDATE of the session row: the counter moved by one event.
COUNTED = "last_event_id = sessions.last_event_id + 1"


def announced(source: str) -> str:
    """The `announced` CTE: the session event numbered by `source`, the composer's CTE that
    updated the session row with `COUNTED` and returns its `id` and `last_event_id`
    (parameters: `announce_params`)."""
    return f"""announced AS (
        INSERT INTO session_events (session_id, id, type, turn_id, message_id, data)
        SELECT {source}.id, {source}.last_event_id, %(live_type)s, %(live_turn_id)s,
            %(live_message_id)s, CAST(%(live_data)s AS jsonb)
        FROM {source}
        RETURNING session_id
    )"""


# The session's doorbell, rung for the event `announced` inserted (a select-list expression).
LIVE_RUNG = f"(SELECT {SESSION_DOORBELL} FROM announced)"


def joining(seq: str) -> str:
    """A user's message joining an open turn at the seq its `seq` CTE takes (store/messages.py
    `seq_taken` with `sets=COUNTED`), announced on the session's log without announcing the
    turn (its streams follow it already): store/posting.py `_join_turn` (an answer to a card
    or a specialist) and store/steering.py `join_as_steer`, each read with `joined_row`
    (parameters: `message_params`' and `announce_params`')."""
    return f"""
    WITH {seq}, {announced("seq")}, joined AS ({MESSAGE_AT_SEQ} RETURNING {MESSAGE_COLUMNS})
    SELECT {MESSAGE_COLUMNS}, {LIVE_RUNG} AS announced FROM joined
    """


def joined_row(*, announced: Any, **columns: Any) -> MessageRow:
    return MessageRow(**columns)


def announce_params(
    type_: SessionEventType,
    data: BaseModel | None = None,
    *,
    turn_id: str | None = None,
    message_id: str | None = None,
) -> dict[str, Any]:
    """The parameters of `announced`: the event's type, the turn it announces, the message it
    is about, and its stored payload (ids only: a message's words are read when it is sent)."""
    if data is not None and type(data) is not SESSION_EVENT_DATA[type_]:
        raise TypeError(f"a {type_} session event does not carry {type(data).__name__}")
    stored = data.model_dump(mode="json") if data is not None else {}
    return {
        "live_type": type_.value,
        "live_turn_id": turn_id,
        "live_message_id": message_id,
        "live_data": json.dumps(stored),
    }


async def announce(
    db: Db,
    *,
    session_id: str,
    type: SessionEventType,
    data: BaseModel | None = None,
    turn_id: str | None = None,
    message_id: str | None = None,
) -> int:
    """Append one session event in the caller's transaction (one statement, which locks the
    session row to its end) and return its id."""
    params = {"session_id": session_id}
    params |= announce_params(type, data, turn_id=turn_id, message_id=message_id)
    found = await db.value(_ANNOUNCE, params)
    if found is None:
        raise LookupError(f"session {session_id} does not exist")
    return int(found)


_ANNOUNCE = f"""
    WITH counted AS (
        UPDATE sessions SET {COUNTED} WHERE id = %(session_id)s
        RETURNING sessions.id, sessions.last_event_id
    ), {announced("counted")}
    SELECT counted.last_event_id, {LIVE_RUNG} AS notified FROM counted
"""


@dataclass(frozen=True)
class SessionEventRow:
    """One session event as a stream reads it: the message it names as it stands now
    (`seq` None: neither in the conversation nor queued any more)."""

    id: int
    type: str
    turn_id: str | None
    message_id: str | None
    data: dict[str, Any]
    created_at: datetime
    seq: int | None
    message_turn_id: str | None
    status: str | None
    text: str | None
    message_created_at: datetime | None
    role: str | None  # the message's: `user`, or a hand-off's `assistant` (store/handoffs.py)
    author_name: str | None


async def read_after(
    db: Db, *, session_id: str, after: int, limit: int = 500
) -> list[SessionEventRow]:
    """The session's events after `after`, in order, each with its message (a queued one's
    from `queued_messages`, with seq 0)."""
    params = {"session_id": session_id, "after": after, "limit": limit}
    return await db.rows(_READ_AFTER, params, SessionEventRow)


_READ_AFTER = """
    SELECT e.id, e.type, e.turn_id, e.message_id, e.data, e.created_at,
        coalesce(m.seq, CASE WHEN q.turn_id IS NOT NULL THEN 0 END) AS seq,
        coalesce(m.turn_id, q.turn_id, e.turn_id) AS message_turn_id,
        coalesce(m.status, CASE WHEN q.turn_id IS NOT NULL THEN 'complete' END) AS status,
        coalesce(m.text, q.text) AS text,
        coalesce(m.created_at, q.created_at) AS message_created_at,
        m.role, m.author_name
    FROM session_events AS e
    LEFT JOIN messages AS m ON m.id = e.message_id
    LEFT JOIN queued_messages AS q ON q.session_id = e.session_id AND q.message_id = e.message_id
    WHERE e.session_id = %(session_id)s AND e.id > %(after)s
    ORDER BY e.id
    LIMIT %(limit)s
"""


@dataclass(frozen=True)
class LiveStart:
    """Where a stream without a cursor starts: the session's last event, and its turns that
    have not ended (oldest first), followed from their first event."""

    last_event_id: int
    open_turns: list[str]


async def live_start(db: Db, *, session_id: str, ended: list[str]) -> LiveStart:
    """One snapshot of both, so a turn born after it is announced after `last_event_id`."""
    row = await db.row(_START, {"session_id": session_id, "ended": ended}, LiveStart)
    return row if row is not None else LiveStart(0, [])


_START = """
    SELECT s.last_event_id,
        coalesce(array_agg(t.id ORDER BY t.created_at, t.id)
            FILTER (WHERE t.id IS NOT NULL), '{}') AS open_turns
    FROM sessions AS s
    LEFT JOIN turns AS t ON t.session_id = s.id AND NOT (t.state = ANY(%(ended)s))
    WHERE s.id = %(session_id)s
    GROUP BY s.last_event_id
"""


@dataclass(frozen=True)
class ResumeStart:
    """Where a stream with a cursor starts: the session's last event now, and which of the
    turns the cursor names are the session's (a cursor names no one else's)."""

    last_event_id: int
    own_turns: list[str]


async def resume_start(db: Db, *, session_id: str, turn_ids: list[str]) -> ResumeStart:
    """One statement; a session that does not exist has nothing (its stream was refused)."""
    params = {"session_id": session_id, "turn_ids": turn_ids}
    row = await db.row(_RESUME, params, ResumeStart)
    return row if row is not None else ResumeStart(0, [])


_RESUME = """
    SELECT s.last_event_id,
        coalesce(array_agg(t.id) FILTER (WHERE t.id IS NOT NULL), '{}') AS own_turns
    FROM sessions AS s
    LEFT JOIN turns AS t ON t.session_id = s.id AND t.id = ANY(%(turn_ids)s)
    WHERE s.id = %(session_id)s
    GROUP BY s.last_event_id
"""
