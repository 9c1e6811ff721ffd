"""A message posted while its session's turn runs: the session's next turn, queued.

At most one per session (`sessions.queued_turn_id`). The queued turn exists from the post on
(state `queued`, its stream open to clients), but its message waits in `queued_messages`,
outside the conversation: it takes its seq only when the turn is promoted, so the running
turn's prompts never see it and the transcript reads in the order the model answered.

Promotion happens in the transaction that ends the running turn (`store.turns` releases the
session and finds the queued id on the row it locked): the message joins the conversation,
the turn moves to `received` (its row becomes an ordinary start outbox) and holds the
session, and `OUTBOX_CHANNEL` wakes the workers' outbox (dispatch/outbox.py), which starts it.
If no worker hears it, the outbox's periodic sweep starts it all the same.

Everything here runs in the caller's transaction, under the session row's lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from parley.contracts import EventType, MessageStatus, TurnState
from parley.ids import new_id
from parley.live import SessionEventType
from parley.store.db import Db
from parley.store.events import (
    BASE,
    DOORBELL,
    EVENTS_INSERTED,
    OUTBOX_CHANNEL,
    RUNG,
    OutboxRing,
    append_events,
    append_params,
    counter,
    ring,
    state_event,
)
from parley.store.identity import Identity
from parley.store.live import COUNTED, LIVE_RUNG, announce_params, announced
from parley.store.messages import MESSAGE_AT_SEQ, SEQ_TAKEN, message_params, next_seq
from parley.store.sessions import SessionRow, lock_session
from parley.store.turn_states import BORN
from parley.store.turns.reads import PostedTurn
from parley.turn_states import IllegalTransition, can_move
from parley.wire import MessageData, MessageView

log = logging.getLogger(__name__)

# Rung (with the promoted turn's id) when a queued turn becomes startable.


@dataclass(frozen=True)
class Startable:
    """A turn the outbox may start (a promoted one, or one whose start was not confirmed), or
    whose workflow it looks up."""

    id: str
    session_id: str
    tenant_id: str


@dataclass(frozen=True)
class QueuedRow:
    """The message a queued turn waits with (`queued_messages`)."""

    turn_id: str
    session_id: str
    message_id: str
    client_message_id: str
    text: str
    file_ids: list[str] | None
    created_at: datetime


_QUEUED_COLUMNS = "turn_id, session_id, message_id, client_message_id, text, file_ids, created_at"


# What a message queued by no API's ring records: no task queue, no trace.
NOT_RUNG = OutboxRing("")


@dataclass(frozen=True)
class Queued:
    """A queued turn as the POST answers it."""

    turn: PostedTurn
    message: MessageView  # the message as it will read once it joins the conversation


async def queue_message(
    db: Db,
    *,
    session: SessionRow,
    owner: Identity,
    client_message_id: str,
    text: str,
    file_ids: Sequence[str],
    posted_on: OutboxRing | None = None,
) -> Queued:
    """Queue the message as the session's next turn (the caller checked there is none yet,
    and holds the session row's lock). The turn is born `queued` with its first event, in
    one statement; `user_seq` is provisional until it is promoted (the seq it would take if
    nothing came between). `posted_on`: the ring the posting API starts a new turn with, whose
    task queue (that of the workers that start its turns) and trace context (the POST's) the
    promotion's ring names again."""
    turn = PostedTurn(new_id("trn"), session.id, owner.tenant_id, owner.user_id, TurnState.queued)
    message_id = new_id("msg")
    params = {
        **append_params(turn.id, [state_event(TurnState.queued)]),
        **announce_params(SessionEventType.message, turn_id=turn.id, message_id=message_id),
        "to": TurnState.queued.value,
        "session_id": session.id,
        "tenant_id": owner.tenant_id,
        "user_id": owner.user_id,
        "message_id": message_id,
        "seq": next_seq(session.last_seq),
        "client_message_id": client_message_id,
        "text": text,
        "file_ids": Jsonb(list(file_ids)) if file_ids else None,
        "task_queue": (posted_on or NOT_RUNG).task_queue,
        "trace": (posted_on or NOT_RUNG).trace or None,
    }
    row = await db.made(_QUEUE, params, _queued_row)
    assert row is not None
    return Queued(turn, queued_view(row))


def _queued_row(*, notified: Any, announced: Any, **columns: Any) -> QueuedRow:
    return QueuedRow(**columns)


# The turn born `queued` (store/turn_states.py `BORN`, as the `counter` of its first event's
# append: store/events.py), its message waiting beside it, and the session told it waits (its
# own log told of the message: store/live.py).
_QUEUE = f"""
    WITH counter AS ({BORN} RETURNING {BASE}), {EVENTS_INSERTED}, waiting AS (
        INSERT INTO queued_messages
            (turn_id, session_id, message_id, client_message_id, text, file_ids, task_queue,
            trace)
        VALUES (%(turn_id)s, %(session_id)s, %(message_id)s, %(client_message_id)s,
            %(text)s, %(file_ids)s, %(task_queue)s, %(trace)s)
        RETURNING {_QUEUED_COLUMNS}
    ), held AS (
        UPDATE sessions SET queued_turn_id = %(turn_id)s, {COUNTED} WHERE id = %(session_id)s
        RETURNING sessions.id, sessions.last_event_id
    ), {announced("held")}
    SELECT {_QUEUED_COLUMNS}, {RUNG} AS notified, {LIVE_RUNG} AS announced FROM waiting
"""


async def promote(db: Db, *, session_id: str, turn_id: str) -> None:
    """The running turn ended (its ending released the session, whose row this transaction
    has locked): the queued message joins the conversation with the next seq, the turn moves
    to `received` and holds the session, and the outbox is rung for a worker of the task
    queue its message was queued for."""
    params = {"session_id": session_id, "turn_id": turn_id}
    waiting = await db.made(_WAITING, params, _waiting)
    if waiting is None:
        return  # dropped meanwhile
    row, last_seq, task_queue, trace = waiting
    if not can_move(TurnState.queued, TurnState.received):
        raise IllegalTransition(turn_id=turn_id, from_state=TurnState.queued, to=TurnState.received)
    joined = message_params(
        message_id=row.message_id,
        turn_id=turn_id,
        role="user",
        text=row.text,
        client_message_id=row.client_message_id,
        file_ids=row.file_ids,
    )
    events = [state_event(TurnState.received)]
    promoted = {
        **params,
        **joined,
        **append_params(turn_id, events, TurnState.received),
        "seq": next_seq(last_seq),
    }
    await db.run(_PROMOTE, promoted)
    rung = OutboxRing(turn_id, task_queue, trace=trace or "", promoted=True)
    await ring(db, channel=OUTBOX_CHANNEL, payload=rung.payload())


def _waiting(
    *, last_seq: int, task_queue: str | None, trace: str | None, **columns: Any
) -> tuple[QueuedRow, int, str | None, str | None]:
    return QueuedRow(**columns), last_seq, task_queue, trace


_WAITING = f"""
    SELECT {", ".join("q." + c for c in _QUEUED_COLUMNS.split(", "))}, s.last_seq, q.task_queue,
        q.trace
    FROM queued_messages AS q JOIN sessions AS s ON s.id = q.session_id
    WHERE q.turn_id = %(turn_id)s AND s.id = %(session_id)s
"""
# The message joins at the seq after the one read under the session's lock (its `seq` CTE is
# the session's UPDATE, which also makes the turn the active one), its waiting row goes, and
# the turn moves to `received` with its `state` event, its `user_seq` the message's now (set
# by the move's own UPDATE: a statement writes a row once).
_PROMOTE = f"""
    WITH seq AS (
        UPDATE sessions SET {SEQ_TAKEN}, active_turn_id = %(turn_id)s, queued_turn_id = NULL
        WHERE id = %(session_id)s
        RETURNING sessions.id, sessions.last_seq, sessions.branch
    ), joined AS ({MESSAGE_AT_SEQ}), dropped AS (
        DELETE FROM queued_messages WHERE turn_id = %(turn_id)s
    ), {counter(moving=True, sets="user_seq = %(seq)s")},
    {EVENTS_INSERTED}
    SELECT {DOORBELL} AS notified FROM inserted
"""


async def queued_message(db: Db, *, queued_turn_id: str | None) -> MessageView | None:
    """The message waiting as the session's next turn (the session's `queued_turn_id`), as
    a reloaded page shows it."""
    if queued_turn_id is None:
        return None
    row = await db.row(_QUEUED, {"turn_id": queued_turn_id}, QueuedRow)
    return None if row is None else queued_view(row)


_QUEUED = f"SELECT {_QUEUED_COLUMNS} FROM queued_messages WHERE turn_id = %(turn_id)s"


async def startable_turn(db: Db, *, turn_id: str) -> Startable | None:
    """The turn, if it is in `received` and its workflow start is not yet confirmed."""
    params = {"turn_id": turn_id, "received": TurnState.received.value}
    return await db.row(_STARTABLE, params, Startable)


_STARTABLE = """
    SELECT id, session_id, tenant_id FROM turns
    WHERE id = %(turn_id)s AND state = %(received)s AND workflow_started_at IS NULL
"""


async def drop_queued(
    db: Db, *, owner: Identity, session_id: str, turn_id: str | None = None
) -> bool:
    """Drop the session's queued turn (a cancel of it: the page's Stop, asked to drop it too;
    the session's deletion, `turn_id` None: whichever waits): it ends `cancelled` and its
    message never joins the conversation. False when `turn_id` is not queued (any more: it
    was promoted meanwhile): the caller cancels it like any turn."""
    session = await lock_session(db, owner=owner, session_id=session_id)
    if turn_id is None:
        turn_id = session.queued_turn_id
    if turn_id is None or session.queued_turn_id != turn_id:
        return False
    row = await db.row(_DROP, {"session_id": session_id, "turn_id": turn_id}, QueuedRow)
    assert row is not None
    dropped = queued_view(row, status=MessageStatus.cancelled)
    await append_events(
        db,
        turn_id=turn_id,
        events=[
            state_event(TurnState.cancelled),
            (EventType.cancelled, MessageData(message=dropped)),
        ],
        moving_to=TurnState.cancelled,
    )
    return True


# The session's queued turn let go of, and its waiting message deleted (returned, for the
# `cancelled` event).
_DROP = f"""
    WITH released AS (
        UPDATE sessions SET queued_turn_id = NULL WHERE id = %(session_id)s
    )
    DELETE FROM queued_messages WHERE turn_id = %(turn_id)s
    RETURNING {_QUEUED_COLUMNS}
"""


def queued_view(row: QueuedRow, *, status: MessageStatus = MessageStatus.complete) -> MessageView:
    """The queued message in the contract's shape; seq 0: it has none until it is promoted."""
    fields: dict[str, Any] = {
        "id": row.message_id,
        "seq": 0,
        "role": "user",
        "turn_id": row.turn_id,
        "status": status,
        "text": row.text,
        "created_at": row.created_at or datetime.now(UTC),
    }
    return MessageView.model_validate(fields)


# How long a listener that lost its connection (the database restarted) waits before it
# connects again.
RECONNECT_S = 1.0


class OutboxBell:
    """The workers' ear for `OUTBOX_CHANNEL`: one LISTEN connection, opened on first use and
    opened again after it fails. Losing a ring costs only time: the periodic sweep finds
    every startable turn anyway."""

    def __init__(self, conninfo: str) -> None:
        self._conninfo = conninfo
        self._conn: psycopg.AsyncConnection[Any] | None = None

    async def listen(self) -> None:
        """Start listening now (else at the first `rung`): a ring before that is not heard.
        A failure to connect is left to `rung`, which tries again."""
        with contextlib.suppress(psycopg.Error):
            await self._connected()

    async def _connected(self) -> psycopg.AsyncConnection[Any]:
        if self._conn is None or self._conn.closed:
            self._conn = await psycopg.AsyncConnection.connect(self._conninfo, autocommit=True)
            await self._conn.execute(f"LISTEN {OUTBOX_CHANNEL}")
        return self._conn

    async def rung(self, timeout: float) -> list[str]:
        """The payloads rung within `timeout` seconds (returning at the first ring), or none
        (store/events.py `OutboxRing`).
        A broken connection is dropped, and nothing is heard for a moment (at most
        `RECONNECT_S`, however long the caller meant to listen) before it connects again."""
        try:
            conn = await self._connected()
            heard = [n.payload async for n in conn.notifies(timeout=timeout, stop_after=1)]
        except psycopg.Error:
            log.warning("the outbox's listener lost its connection", exc_info=True)
            await self.close()
            await asyncio.sleep(min(timeout, RECONNECT_S))
            return []
        return heard

    async def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(psycopg.Error):
                await self._conn.close()
            self._conn = None
