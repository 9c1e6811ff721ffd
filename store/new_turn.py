"""A new turn's first write: the user message, the turn (born in `received`, the start
outbox), its `received` event and the session's next seq and active turn, in one statement.

Every plain post runs it, so it is one round trip built once; the caller holds the session's
lock (store/posting.py) and gets typed rows back.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

from sqlalchemy import Select, Table, Text, bindparam, func, insert, select, true, update
from sqlalchemy.ext.asyncio import AsyncSession

from parley.contracts import MessageStatus, TurnState
from parley.ids import new_id
from parley.wire import MessageView
from store.events import NOTIFY_CHANNEL, opening_event, state_event
from store.identity import Identity
from store.models import ChatSession, Message, Turn, TurnEvent
from store.models.core import count_tokens


async def insert_message_and_turn(
    db: AsyncSession,
    *,
    session_id: str,
    last_seq: int,
    owner: Identity,
    client_message_id: str,
    text: str,
    attached: Sequence[str],
) -> tuple[MessageView, str]:
    """Write the message and its new turn after `last_seq` (read under the session's lock);
    return the message as the contract shows it and the turn's id. The ORM classes only
    shape the parameters here: nothing joins the ORM session."""
    turn_id, seq = new_id("trn"), last_seq + 1
    row = Message(
        id=new_id("msg"),
        session_id=session_id,
        seq=seq,
        role="user",
        turn_id=turn_id,
        status=MessageStatus.complete,
        text=text,
        client_message_id=client_message_id,
        file_ids=list(attached) or None,
    )
    count_tokens(row)
    turn = Turn(
        id=turn_id,
        session_id=session_id,
        tenant_id=owner.tenant_id,
        user_id=owner.user_id,
        user_message_id=row.id,
        user_seq=seq,
        state=TurnState.received,
        last_event_id=1,  # its `received` event is written with it
        viewers=0,
    )
    stamps = (await db.execute(_WRITE, _write_params(row, turn))).one()
    row.created_at = stamps.message_created_at
    return MessageView.from_row(row), turn_id


def _write_statement() -> Select[Any]:
    """Insert the message, the turn and its first event (`received`, rung on the doorbell as
    `append_events` would) and move the session on, returning the rows' stamps. Built once,
    with a parameter per written column (`m_<column>`, `t_<column>`): a statement built per
    post is compiled, or looked up by a cache key computed afresh, per post."""
    messages, turns, sessions, events = (
        cast(Table, m.__table__) for m in (Message, Turn, ChatSession, TurnEvent)
    )
    new_message = (
        insert(messages)
        .values({c: bindparam(f"m_{c}", type_=messages.c[c].type) for c in _MESSAGE_WRITTEN})
        .returning(messages.c.created_at)
        .cte("new_message")
    )
    new_turn = (
        insert(turns)
        .values({c: bindparam(f"t_{c}", type_=turns.c[c].type) for c in _TURN_WRITTEN})
        .returning(turns.c.created_at, turns.c.updated_at)
        .cte("new_turn")
    )
    first_event = (
        insert(events)
        .values(
            turn_id=bindparam("t_id"),
            id=1,
            type=bindparam("e_type", type_=events.c.type.type),
            data=bindparam("e_data", type_=events.c.data.type),
        )
        .returning(events.c.id)
        .cte("first_event")
    )
    moved = (
        update(sessions)
        .where(sessions.c.id == bindparam("s_id", type_=sessions.c.id.type))
        .values(
            last_seq=bindparam("s_last_seq", type_=sessions.c.last_seq.type),
            active_turn_id=bindparam("s_active_turn_id", type_=sessions.c.active_turn_id.type),
        )
        .returning(sessions.c.id)
        .cte("moved_session")
    )
    return select(
        new_message.c.created_at.label("message_created_at"),
        new_turn.c.created_at.label("turn_created_at"),
        new_turn.c.updated_at.label("turn_updated_at"),
        moved.c.id.label("session_id"),
        func.pg_notify(NOTIFY_CHANNEL, bindparam("e_notify", type_=Text)).label("rung"),
    ).select_from(  # one row each
        new_message.join(new_turn, true()).join(first_event, true()).join(moved, true())
    )


def _write_params(message: Message, turn: Turn) -> dict[str, Any]:
    params = {f"m_{c}": getattr(message, c) for c in _MESSAGE_WRITTEN}
    params |= {f"t_{c}": getattr(turn, c) for c in _TURN_WRITTEN}
    type_, data = state_event(TurnState.received)
    wire, notify = opening_event(turn.id, type_, data)
    params |= {"e_type": type_.value, "e_data": wire, "e_notify": notify}
    return params | {
        "s_id": turn.session_id,
        "s_last_seq": message.seq,
        "s_active_turn_id": turn.id,
    }


_MESSAGE_WRITTEN = (
    "id", "session_id", "seq", "role", "turn_id", "status", "text", "client_message_id",
    "file_ids", "token_count", "token_counter",
)  # fmt: skip
_TURN_WRITTEN = (
    "id", "session_id", "tenant_id", "user_id", "user_message_id", "user_seq", "state",
    "last_event_id", "viewers",
)  # fmt: skip
_WRITE = _write_statement()
