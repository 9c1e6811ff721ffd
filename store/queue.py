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
from sqlalchemy import delete, select
from sqlalchemy.ext.asyncio import AsyncSession

from parley.contracts import EventType, MessageStatus, TurnState
from parley.ids import new_id
from parley.store.db import session_conn
from parley.store.events import append_events, ring, state_event
from parley.store.identity import Identity
from parley.store.messages import next_seq, take_seq
from parley.store.models import ChatSession, Message, QueuedMessage, Turn
from parley.store.sessions import lock_session
from parley.turn_states import IllegalTransition, can_move
from parley.wire import MessageData, MessageView

log = logging.getLogger(__name__)

# Rung (with the promoted turn's id) when a queued turn becomes startable.
OUTBOX_CHANNEL = "parley_outbox"


@dataclass(frozen=True)
class Startable:
    """A turn the outbox may start (a promoted one, or one whose start was not confirmed), or
    whose workflow it looks up."""

    id: str
    session_id: str
    tenant_id: str


@dataclass(frozen=True)
class Queued:
    """A queued turn as the POST answers it."""

    turn: Turn
    message: MessageView  # the message as it will read once it joins the conversation


async def queue_message(
    db: AsyncSession,
    *,
    session: ChatSession,
    owner: Identity,
    client_message_id: str,
    text: str,
    file_ids: Sequence[str],
) -> Queued:
    """Queue the message as the session's next turn (the caller checked there is none yet).
    The turn is born `queued` with its first event; `user_seq` is provisional until it is
    promoted (the seq it would take if nothing came between)."""
    message_id = new_id("msg")
    turn = Turn(
        id=new_id("trn"),
        session_id=session.id,
        tenant_id=owner.tenant_id,
        user_id=owner.user_id,
        user_message_id=message_id,
        user_seq=next_seq(session.last_seq),
        state=TurnState.queued,
    )
    row = QueuedMessage(
        turn_id=turn.id,
        session_id=session.id,
        message_id=message_id,
        client_message_id=client_message_id,
        text=text,
        file_ids=list(file_ids) or None,
    )
    db.add(turn)
    await db.flush()  # the turn first: the queued row refers to it
    db.add(row)
    session.queued_turn_id = turn.id
    await db.flush()
    await append_events(db, turn_id=turn.id, events=[state_event(TurnState.queued)])
    return Queued(turn, queued_view(row))


async def promote(db: AsyncSession, *, session_id: str, turn_id: str) -> None:
    """The running turn ended (its ending released the session, whose row this transaction
    has locked): the queued message joins the conversation with the next seq, the turn moves
    to `received` and holds the session, and the outbox is rung."""
    row = await db.get(QueuedMessage, turn_id)
    session = await db.get(ChatSession, session_id, populate_existing=True)
    if row is None or session is None:
        return  # dropped meanwhile
    if not can_move(TurnState.queued, TurnState.received):
        raise IllegalTransition(turn_id=turn_id, from_state=TurnState.queued, to=TurnState.received)
    seq = take_seq(session)
    db.add(
        Message(
            id=row.message_id,
            session_id=session_id,
            seq=seq,
            role="user",
            turn_id=turn_id,
            status=MessageStatus.complete,
            text=row.text,
            client_message_id=row.client_message_id,
            file_ids=row.file_ids,
        )
    )
    session.active_turn_id, session.queued_turn_id = turn_id, None
    await db.flush()
    await db.execute(delete(QueuedMessage).where(QueuedMessage.turn_id == turn_id))
    turn = await db.get(Turn, turn_id, with_for_update=True, populate_existing=True)
    assert turn is not None
    turn.user_seq = seq
    await db.flush()
    # The state and its `state` event in one statement (as `store.turns.move_turn` does).
    await append_events(
        db, turn_id=turn_id, events=[state_event(TurnState.received)], moving_to=TurnState.received
    )
    db.expire(turn)  # its state was set in SQL
    await ring(await session_conn(db), channel=OUTBOX_CHANNEL, payload=turn_id)


async def queued_message(db: AsyncSession, *, queued_turn_id: str | None) -> MessageView | None:
    """The message waiting as the session's next turn (the session's `queued_turn_id`), as
    a reloaded page shows it."""
    if queued_turn_id is None:
        return None
    row = await db.get(QueuedMessage, queued_turn_id)
    return None if row is None else queued_view(row)


async def startable_turn(db: AsyncSession, *, turn_id: str) -> Startable | None:
    """The turn, if it is in `received` and its workflow start is not yet confirmed."""
    row = (
        await db.execute(
            select(Turn.id, Turn.session_id, Turn.tenant_id).where(
                Turn.id == turn_id,
                Turn.state == TurnState.received,
                Turn.workflow_started_at.is_(None),
            )
        )
    ).one_or_none()
    return None if row is None else Startable(row.id, row.session_id, row.tenant_id)


async def drop_queued(
    db: AsyncSession, *, owner: Identity, session_id: str, turn_id: str | None = None
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
    row = await db.get(QueuedMessage, turn_id)
    assert row is not None
    dropped = queued_view(row, status=MessageStatus.cancelled)
    session.queued_turn_id = None
    await db.execute(delete(QueuedMessage).where(QueuedMessage.turn_id == turn_id))
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


def queued_view(
    row: QueuedMessage, *, status: MessageStatus = MessageStatus.complete
) -> MessageView:
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


class OutboxBell:
    """The workers' ear for `OUTBOX_CHANNEL`: one LISTEN connection, opened on first use and
    opened again after it fails. Losing a ring costs only time: the periodic sweep finds
    every startable turn anyway."""

    def __init__(self, conninfo: str) -> None:
        self._conninfo = conninfo
        self._conn: psycopg.AsyncConnection[Any] | None = None

    async def rung(self, timeout: float) -> list[str]:
        """The turn ids rung within `timeout` seconds (returning at the first ring), or none.
        A broken connection is dropped, and the wait passes as if nothing rang."""
        try:
            if self._conn is None or self._conn.closed:
                self._conn = await psycopg.AsyncConnection.connect(self._conninfo, autocommit=True)
                await self._conn.execute(f"LISTEN {OUTBOX_CHANNEL}")
            heard = [n.payload async for n in self._conn.notifies(timeout=timeout, stop_after=1)]
        except psycopg.Error:
            log.warning("the outbox's listener lost its connection", exc_info=True)
            await self.close()
            await asyncio.sleep(timeout)
            return []
        return heard

    async def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(psycopg.Error):
                await self._conn.close()
            self._conn = None
