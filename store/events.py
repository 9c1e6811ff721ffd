"""The per-turn event log behind every stream, and every doorbell of the record.

Every payload is the contract's model for its event type (`parley.wire.EVENT_DATA`), so what
a stream sends has one shape, written down once.

Appends take the turn row's lock to hand out the next id, so ids are gap-free and monotonic
even when two writers race (an activity retried while its old attempt is still finishing).
The NOTIFY is sent inside the same transaction, so listeners are woken only once the event
is committed and readable; it carries the events themselves when they fit, so a live stream
need not read them back. The deltas are the exception: a worker's writer appends many turns'
frames in one commit with no NOTIFY (`append_frames`), then rings once for the turns that
moved (`ring_turns`, a line per turn in the one payload format), so no delta's commit waits
on PostgreSQL's notification lock.

This module owns the append (the turn's counter moved, the events inserted) and the doorbell
(its channel and payload, the batched ring, a session's `SESSION_DOORBELL` on the same
channel, the one other bell, `ring`, and the steer's, `STEER_SEQ_OF_SESSION`, which a
streaming step hears with its appends). A statement that appends as part of a larger write
composes `counter`, `EVENTS_INSERTED` and `DOORBELL` (or `RUNG`) instead of writing them
again: store/turns/endings.py (an ending's release), store/turns/attempts.py (an
attempt's opening), store/context.py (the build's move), store/turns/birth.py,
store/turns/birth.py `open_turn` and store/queue.py `queue_message` (a turn born with its first
event) and store/queue.py `promote` (a queued turn's promotion). A move of the turn's state
is the counter's own UPDATE, opened by store/turn_states.py `MOVE`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from parley.contracts import TERMINAL_TURN_STATES, EventType, TurnState
from parley.store.db import Db
from parley.store.turn_states import MOVE, move_params
from parley.wire import EVENT_DATA, StateData, WarningData

NOTIFY_CHANNEL = "parley_turn_events"
# The steer's doorbell (store/steering.py): the seq of the session's newest steering message,
# for a statement that names the session in SQL as `{session}`. Read with every streamed
# append and by the quiet check, beside the Stop.
STEER_SEQ_OF_SESSION = "(SELECT steer_seq FROM sessions WHERE id = {session})"
# The doorbell's payload: `turn_id:first_id:batch`, the batch being the appended events as
# written (a JSON list of {type, data}) when it fits in a notification (PostgreSQL's limit is
# 8000 bytes), else empty. A listener that already has every event before `first_id` can send
# the batch without reading the log; anything else (a gap, an empty batch) reads the log.
NOTIFY_EVENTS_MAX = 7600


@dataclass(frozen=True)
class StoredEvent:
    id: int
    type: str
    data: dict[str, Any]


def parse_notification(payload: str) -> tuple[str, list[StoredEvent]]:
    """The turn a doorbell rang for and the events it brought: none when they did not fit, or
    for the older `turn_id:last_id` payload (a worker of the previous release)."""
    turn_id, _, rest = payload.partition(":")
    first, _, batch = rest.partition(":")
    if not batch or not first.isdigit():
        return turn_id, []
    start = int(first)
    return turn_id, [
        StoredEvent(id=start + i, type=e["type"], data=e["data"])
        for i, e in enumerate(json.loads(batch))
    ]


async def append_event(db: Db, *, turn_id: str, type: EventType, data: BaseModel) -> int:
    """Append one event within the caller's transaction and return its id."""
    return (await append_events(db, turn_id=turn_id, events=[(type, data)]))[-1]


async def append_events(
    db: Db,
    *,
    turn_id: str,
    events: Sequence[tuple[EventType, BaseModel]],
    moving_to: TurnState | None = None,
    answer: str | None = None,
) -> list[int]:
    """Append events within the caller's transaction (a session's, or a `Db`'s: in
    autocommit, the append commits by itself): one round trip that takes the ids from the
    turn row (locking it), inserts the events and rings the doorbell. With `moving_to`, the
    same statement sets the turn's state: a move and its announcement are one round trip;
    with `answer`, the turn's answer (`assistant_message_id`) too."""
    last = (await _append(db, turn_id, events, moving_to, answer)).event_id
    return list(range(last - len(events) + 1, last + 1))


async def append_streamed(conn: Db, *, turn_id: str, type: EventType, data: BaseModel) -> Appended:
    """`append_event` for a streaming step (the deltas, a turn's most frequent write), which
    learns in the same round trip whether the user's Stop is recorded on the turn, and the
    session's steer doorbell (store/steering.py)."""
    return await _append(conn, turn_id, [(type, data)], None, None)


async def _append(
    conn: Db,
    turn_id: str,
    events: Sequence[tuple[EventType, BaseModel]],
    moving_to: TurnState | None,
    answer: str | None,
) -> Appended:
    params = append_params(turn_id, events, moving_to, answer)
    statement = _APPEND if moving_to is None else _APPEND_MOVING
    found = await conn.made(statement, params, _appended)
    if found is None:
        raise LookupError(f"turn {turn_id} does not exist")
    return found


def append_params(
    turn_id: str,
    events: Sequence[tuple[EventType, BaseModel]],
    moving_to: TurnState | None = None,
    answer: str | None = None,
) -> dict[str, Any]:
    """The parameters of an append (`_APPEND`'s), for a statement of another module that
    appends as part of a larger write; with `moving_to`, `MOVE`'s too (and `answer`, the
    turn's answer the move sets)."""
    assert answer is None or moving_to is not None, "an answer is set by a move"
    payload = json.dumps([{"type": type_, "data": _wire(type_, data)} for type_, data in events])
    params = {"turn_id": turn_id, "n": len(events), "events": payload}
    if moving_to is not None:
        params |= move_params(moving_to, answer=answer)
    return params


def _appended(
    *, event_id: int | None, stopped: bool | None, steer_seq: int | None, notified: Any
) -> Appended | None:
    return (
        None
        if event_id is None
        else Appended(stopped=bool(stopped), steer_seq=steer_seq, event_id=event_id)
    )


async def append_frames(conn: Db, frames: Sequence[Frame]) -> dict[str, Appended]:
    """Append the frames of several turns (one per turn) in one statement, in autocommit on
    a `Db` outside a transaction: one commit for a worker's streaming steps together
    (activities/frame_writer.py). It rings no doorbell (no NOTIFY holds PostgreSQL's one
    notification lock while the deltas commit): the writer rings once for the turns that
    moved, `ring_turns`. Each turn's outcome as `append_streamed` gives it; a turn that does
    not exist is missing."""
    ordered = sorted(frames, key=lambda frame: frame.turn_id)  # rows locked in one order
    assert len({f.turn_id for f in ordered}) == len(ordered), "one frame per turn"
    batch = [{"turn_id": f.turn_id, "events": _batch(f.events)} for f in ordered]
    rows = await conn.rows(_APPEND_FRAMES, {"frames": json.dumps(batch)}, _FrameAppended)
    return {
        r.turn_id: Appended(stopped=r.stopped, steer_seq=r.steer_seq, event_id=r.event_id)
        for r in rows
    }


@dataclass(frozen=True)
class Frame:
    """One turn's events for `append_frames`."""

    turn_id: str
    events: Sequence[tuple[EventType, BaseModel]]


@dataclass(frozen=True)
class _FrameAppended:
    turn_id: str
    event_id: int
    stopped: bool
    steer_seq: int | None


def _batch(events: Sequence[tuple[EventType, BaseModel]]) -> list[dict[str, Any]]:
    return [{"type": type_, "data": _wire(type_, data)} for type_, data in events]


# `counter` and `EVENTS_INSERTED` for many turns: the turns locked in id order (two writers
# never wait on each other in a cycle), each counter moved by its frame's size, the events
# inserted after each base; no doorbell. `updated_at` (in the index of open turns) moves
# only when it is `FRAME_TOUCH` old: a delta's update then changes no indexed column, so it
# can stay on its page (HOT), and the quiet-turn sweep (2 minutes) still sees a live turn.
FRAME_TOUCH = "10 seconds"
_APPEND_FRAMES = f"""
    WITH frames AS (
        SELECT f.turn_id, f.events, jsonb_array_length(f.events) AS n
        FROM jsonb_to_recordset(CAST(%(frames)s AS jsonb)) AS f(turn_id text, events jsonb)
    ), locked AS (
        SELECT turns.id FROM turns JOIN frames ON frames.turn_id = turns.id
        ORDER BY turns.id FOR UPDATE OF turns
    ), counter AS (
        UPDATE turns SET last_event_id = turns.last_event_id + frames.n,
            updated_at = CASE WHEN turns.updated_at < now() - interval '{FRAME_TOUCH}'
                THEN now() ELSE turns.updated_at END
        FROM frames JOIN locked ON locked.id = frames.turn_id
        WHERE turns.id = frames.turn_id
        RETURNING turns.id AS turn_id, turns.last_event_id - frames.n AS base, frames.events,
            turns.last_event_id AS event_id,
            turns.cancel_requested_at IS NOT NULL AS stopped,
            {STEER_SEQ_OF_SESSION.format(session="turns.session_id")} AS steer_seq
    ), inserted AS (
        INSERT INTO turn_events (turn_id, id, type, data, created_at)
        SELECT counter.turn_id, counter.base + e.ord, e.value ->> 'type', e.value -> 'data',
            now()
        FROM counter, jsonb_array_elements(counter.events) WITH ORDINALITY AS e(value, ord)
    )
    SELECT turn_id, event_id, stopped, steer_seq FROM counter
"""


def turn_ring(turn_id: str, first_id: int, events: Sequence[tuple[EventType, BaseModel]]) -> str:
    """One turn's line of a batched ring (`ring_turns`): the doorbell's own payload,
    `turn_id:first_id:batch`, the batch empty when it does not fit."""
    batch = json.dumps(_batch(events))
    if len(batch.encode()) > NOTIFY_EVENTS_MAX:
        batch = ""
    return f"{turn_id}:{first_id}:{batch}"


async def ring_turns(conn: Db, lines: Sequence[str]) -> None:
    """Ring the event log's doorbell once for many turns that moved (`turn_ring`'s lines), in
    a statement of its own: as few notifications as fit the lines, newline-separated (a
    listener reads each line as one doorbell: `parse_ring`)."""
    payloads: list[str] = []
    for line in lines:
        if payloads and len(payloads[-1]) + len(line) < _RING_MAX:
            payloads[-1] += "\n" + line
        else:
            payloads.append(line)
    if payloads:
        await conn.run(_RING_ALL, {"channel": NOTIFY_CHANNEL, "payloads": payloads})


# Below PostgreSQL's 8000 bytes (a line's batch is at most NOTIFY_EVENTS_MAX); `len` counts
# characters, and the batch's JSON is ASCII (json.dumps escapes the rest).
_RING_MAX = 7900
_RING_ALL = "SELECT pg_notify(%(channel)s, p) FROM unnest(CAST(%(payloads)s AS text[])) AS p"


def parse_ring(payload: str) -> list[str]:
    """The doorbells of one notification: a batched ring's lines, or the one a single
    append rang."""
    return payload.split("\n")


async def append_while_open(conn: Db, *, turn_id: str, type: EventType, data: BaseModel) -> bool:
    """Append one event unless the turn has ended or its Stop is recorded (then nothing is
    written): one statement, in autocommit on a `Db` outside a transaction. Whether it was
    appended."""
    params = {**append_params(turn_id, [(type, data)]), "ended": _ENDED}
    return await conn.row(_APPEND_WHILE_OPEN, params, _Notified) is not None


@dataclass(frozen=True)
class _Notified:
    notified: Any


async def stop_or_steer(conn: Db, *, turn_id: str) -> Heard:
    """Whether the user's Stop is recorded on the turn, and the session's steer doorbell,
    read on a streaming step's own connection (its appends') while it has nothing to
    append."""
    heard = await conn.row(_STOP_OR_STEER, {"turn_id": turn_id}, Heard)
    return heard if heard is not None else Heard(False, None)


@dataclass(frozen=True)
class Heard:
    # The turn's Stop is recorded: a step that streams for it stops at once.
    stopped: bool
    # The seq of the session's newest steering message (store/steering.py), or None.
    steer_seq: int | None


_STOP_OR_STEER = f"""
    SELECT cancel_requested_at IS NOT NULL AS stopped,
        {STEER_SEQ_OF_SESSION.format(session="turns.session_id")} AS steer_seq
    FROM turns WHERE id = %(turn_id)s
"""


@dataclass(frozen=True)
class Appended(Heard):
    # The id of the last event appended.
    event_id: int = 0


def state_event(state: TurnState) -> tuple[EventType, BaseModel]:
    """The `state` event of a turn entering `state`."""
    # Validated rather than constructed: the wire names states as literals, the store as enums.
    return EventType.state, StateData.model_validate({"state": state})


def _wire(type_: EventType, data: BaseModel) -> dict[str, Any]:
    """The stored JSON of one payload; a model of another event type is a bug, refused here."""
    expected = EVENT_DATA[type_]
    if type(data) is not expected:
        raise TypeError(f"a {type_} event carries {expected.__name__}, not {type(data).__name__}")
    return data.model_dump(mode="json")


# How an append takes its ids: the turn's counter moves by the batch's size, in an UPDATE of
# the turn named `counter` whose RETURNING gives `base`, the turn's last event id before the
# batch (parameters `turn_id`, `n`, `events`: `append_params`). A move of the turn's state is
# the same UPDATE (`moving`: store/turn_states.py `MOVE` opens it), so a move and its
# announcement take one row lock; a turn's birth is its INSERT instead (store/turns/birth.py).
_COUNTED = "last_event_id = turns.last_event_id + %(n)s, updated_at = now()"
BASE = "turns.last_event_id - %(n)s AS base"


def counter(
    *,
    moving: bool = False,
    rest: str = "WHERE turns.id = %(turn_id)s",
    returning: str = "",
    sets: str = "",
) -> str:
    """The `counter` CTE of an append; `rest`: what follows its SET list (a `FROM` and a
    `WHERE`, which may guard it: no row, no append), `returning`: columns after `base`,
    `sets`: more of the turn's columns the same UPDATE sets (`name = value, ...`: a
    statement writes a row once, so a composer that changes the turn does it here)."""
    update = f"{MOVE}, {_COUNTED}" if moving else f"UPDATE turns SET {_COUNTED}"
    more = f", {sets}" if sets else ""
    return f"counter AS ({update}{more} {rest} RETURNING {BASE}{returning})"


# The events inserted with the ids after `counter`'s base, and the doorbell rung for them (the
# first id and the batch itself when it fits a notification, else nothing after the colon:
# the listener reads the log), an aggregate over `inserted`. `RUNG` rings it from a scalar
# subquery, and only when an event was inserted, for a statement that reads other rows (and
# whose guarded counter may append nothing).
EVENTS_INSERTED = """inserted AS (
        INSERT INTO turn_events (turn_id, id, type, data, created_at)
        SELECT %(turn_id)s, counter.base + e.ord, e.value ->> 'type', e.value -> 'data', now()
        FROM counter,
            jsonb_array_elements(CAST(%(events)s AS jsonb)) WITH ORDINALITY AS e(value, ord)
        RETURNING id
    )"""
DOORBELL = f"""pg_notify(
        '{NOTIFY_CHANNEL}',
        %(turn_id)s || ':' || (max(id) - %(n)s + 1)::text || ':'
        || CASE WHEN octet_length(CAST(%(events)s AS text)) <= {NOTIFY_EVENTS_MAX}
            THEN CAST(%(events)s AS text) ELSE '' END
    )"""
RUNG = f"(SELECT {DOORBELL} FROM inserted HAVING count(*) > 0)"
# A session's doorbell (its own log's, store/live.py): the session's id as the key, no events
# (a stream that hears it reads that log); a select-list expression over a `session_id`.
SESSION_DOORBELL = f"pg_notify('{NOTIFY_CHANNEL}', session_id || ':')"


def _appending(counter_cte: str, returning: str = "") -> str:
    return f"""
    WITH {counter_cte}, {EVENTS_INSERTED}
    SELECT max(id) AS event_id, {DOORBELL} AS notified{returning}
    FROM inserted
    """


_STOPPED = f""", turns.cancel_requested_at IS NOT NULL AS stopped,
        {STEER_SEQ_OF_SESSION.format(session="turns.session_id")} AS steer_seq"""
_HEARD = ", (SELECT stopped FROM counter) AS stopped, (SELECT steer_seq FROM counter) AS steer_seq"
_APPEND = _appending(counter(returning=_STOPPED), _HEARD)
_APPEND_MOVING = _appending(counter(moving=True, returning=_STOPPED), _HEARD)

_ENDED = [state.value for state in TERMINAL_TURN_STATES]
_OPEN = """WHERE turns.id = %(turn_id)s AND NOT (turns.state = ANY(%(ended)s))
            AND turns.cancel_requested_at IS NULL"""
# `_APPEND` of one event, for a turn that is still open: the counter's UPDATE (whose row lock a
# Stop or an ending waits on, or that waits on theirs and then sees their row) finds no row
# otherwise, and then nothing is inserted and no doorbell rung (no row comes back).
_APPEND_WHILE_OPEN = f"""
    WITH {counter(rest=_OPEN)}, {EVENTS_INSERTED}
    SELECT {DOORBELL} AS notified FROM inserted HAVING count(*) > 0
    """


# The workers' outbox (dispatch/outbox.py) hears of a turn to start on this channel: a turn
# promoted from its session's queue (store/queue.py), or a new turn's post (store/turns/birth.py,
# which rings it from its write: `OUTBOX_DOORBELL`, a select-list expression whose payload is
# `%(outbox_ring)s`, nothing rung when that is NULL). The payload is an `OutboxRing`.
OUTBOX_CHANNEL = "parley_outbox"
OUTBOX_DOORBELL = f"""CASE WHEN CAST(%(outbox_ring)s AS text) IS NOT NULL
        THEN pg_notify('{OUTBOX_CHANNEL}', CAST(%(outbox_ring)s AS text)) END"""


@dataclass(frozen=True)
class OutboxRing:
    """What the outbox's doorbell says: the turn to start; for a new turn's post, what its
    API starts it with (the task queue: only a worker of that queue claims it; the card's
    window and whether a fallback model is configured, as the API's settings say) and the
    post's trace context (W3C `traceparent`, empty when tracing is off), so the start joins
    the POST's trace. Space-separated, the turn id first. A turn promoted from its session's
    queue (`promoted`) rings its id, the task queue of the API that queued it and the trace
    context of the POST that did: a worker of that queue starts it with its own settings, in
    that trace. One queued before that queue was recorded rings its id alone, and any worker
    may start it."""

    turn_id: str
    task_queue: str | None = None
    confirmation_timeout_s: float = 0.0
    fallback: bool = False
    trace: str = ""
    promoted: bool = False

    def payload(self) -> str:
        if self.task_queue is None:
            return self.turn_id
        if self.promoted:
            return " ".join(filter(None, (self.turn_id, self.task_queue, self.trace)))
        window, fallback = f"{self.confirmation_timeout_s:g}", "1" if self.fallback else "0"
        return " ".join((self.turn_id, self.task_queue, window, fallback, self.trace)).rstrip()

    @classmethod
    def heard(cls, payload: str) -> OutboxRing:
        turn_id, *rest = payload.split(" ")
        if len(rest) < 3:  # a promoted turn's: its id, then its queue and trace when recorded
            queue, context = (rest[0] if rest else None), (rest[1] if len(rest) > 1 else "")
            return cls(turn_id, queue, trace=context, promoted=True)
        task_queue, window, fallback, *trace = rest
        return cls(turn_id, task_queue, float(window), fallback == "1", "".join(trace))


async def ring(conn: Db, *, channel: str, payload: str) -> None:
    """Ring another doorbell of the record (store/queue.py's outbox), in the caller's
    transaction: heard at its commit."""
    await conn.run(_RING, {"channel": channel, "payload": payload})


_RING = "SELECT pg_notify(%(channel)s, %(payload)s)"


async def ring_log(conn: Db, *, log_id: str, first_id: int, events: list[dict[str, Any]]) -> None:
    """Ring the event log's doorbell for another log the streams follow (a hand-off's,
    store/handoffs.py), in the payload's one format: `log_id:first_id:batch`."""
    batch = json.dumps(events)
    if len(batch.encode()) > NOTIFY_EVENTS_MAX:
        batch = ""  # the listener reads the log
    await ring(conn, channel=NOTIFY_CHANNEL, payload=f"{log_id}:{first_id}:{batch}")


async def withdraw_turn_text(db: Db, *, turn_id: str) -> None:
    """The output screen withdrew the turn's answer: blank the text of every `delta` the
    turn streamed, and of the turn's tool-calling messages, so that neither a replay from
    any id nor the message list serves the withdrawn words again. Event ids stay as they are
    (a client resuming mid-turn keeps its place); the `retracted` event that follows says
    what to show instead."""
    await db.run(_WITHDRAW_DELTAS, {"turn_id": turn_id})
    await db.run(_WITHDRAW_MESSAGES, {"turn_id": turn_id})


_WITHDRAW_DELTAS = (
    "UPDATE turn_events SET data = jsonb_set(data, '{text}', '\"\"') "
    "WHERE turn_id = %(turn_id)s AND type = 'delta' AND data ->> 'text' <> ''"
)
_WITHDRAW_MESSAGES = (
    "UPDATE messages SET text = '' "
    "WHERE turn_id = %(turn_id)s AND role = 'assistant' AND tool_calls IS NOT NULL"
)


async def warn_once(db: Db, *, turn_id: str, data: WarningData) -> bool:
    """Append the `warning` unless the turn's log holds one with its code already (a warning
    a turn gives once, however many steps meet its cause): the look and the append are one
    statement, sent with the `BEGIN` of a unit of work that starts with it, so one round
    trip. Whether it was appended (False too for a turn that does not exist)."""
    params = append_params(turn_id, [(EventType.warning, data)]) | {"code": data.code}
    async with db.together():
        sent = await db.send_made(_WARN_ONCE, params, _warned)
    return bool(await sent.row())


def _warned(*, appended: bool | None, notified: Any) -> bool:
    return bool(appended)


# `_APPEND` of one warning, for a turn whose log holds none of its code: the counter's UPDATE
# finds no row otherwise, and then nothing is inserted, no doorbell rung, no row comes back.
_UNWARNED = """WHERE turns.id = %(turn_id)s AND NOT EXISTS (
            SELECT 1 FROM turn_events WHERE turn_id = %(turn_id)s AND type = 'warning'
                AND data ->> 'code' = %(code)s)"""
_WARN_ONCE = f"""
    WITH {counter(rest=_UNWARNED)}, {EVENTS_INSERTED}
    SELECT true AS appended, {DOORBELL} AS notified FROM inserted HAVING count(*) > 0
    """


# The statements that append and do nothing else: how many a turn sends follows how its
# answer's tokens fall into frames, not its shape (tests that count a turn's statements leave
# them out).
APPENDS_ALONE = (_APPEND, _APPEND_MOVING, _APPEND_WHILE_OPEN, _APPEND_FRAMES, _RING_ALL)
