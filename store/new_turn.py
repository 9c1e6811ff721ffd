"""A new turn's first write: the user message, the turn (born in `received`, the start
outbox), its `received` event and the session's next seq and active turn, in one statement.

Every plain post runs it, so it is one round trip built once; the caller holds the session's
lock (store/posting.py) and gets typed rows back.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from parley.contracts import MessageStatus, TurnState
from parley.ids import new_id
from parley.wire import MessageView
from store.db import session_conn
from store.events import NOTIFY_CHANNEL, opening_event, state_event
from store.identity import Identity
from store.models import Message
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
    return the message as the contract shows it and the turn's id. The ORM class only
    shapes the message (its token count, its view) here: nothing joins the ORM session, and
    the statement runs on the session's own connection, in its transaction."""
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
    conn = await session_conn(db)
    row.created_at = await conn.value(_WRITE, _write_params(row, owner))
    return MessageView.from_row(row), turn_id


def _write_params(message: Message, owner: Identity) -> dict[str, Any]:
    type_, data = state_event(TurnState.received)
    wire, notify = opening_event(message.turn_id or "", type_, data)
    return {
        "message_id": message.id,
        "session_id": message.session_id,
        "seq": message.seq,
        "text": message.text,
        "client_message_id": message.client_message_id,
        "file_ids": json.dumps(message.file_ids) if message.file_ids is not None else None,
        "token_count": message.token_count,
        "token_counter": message.token_counter,
        "turn_id": message.turn_id,
        "tenant_id": owner.tenant_id,
        "user_id": owner.user_id,
        "event_type": type_.value,
        "event_data": json.dumps(wire),
        "notify": notify,
    }


# Insert the message, the turn and its first event (`received`, rung on the doorbell as
# `append_events` would) and move the session on, returning the message's stamp. Plain SQL on
# psycopg's own connection, written once: every plain post runs it.
_WRITE = f"""
    WITH new_message AS (
        INSERT INTO messages (id, session_id, seq, role, turn_id, status, text,
            client_message_id, file_ids, token_count, token_counter)
        VALUES (%(message_id)s, %(session_id)s, %(seq)s, 'user', %(turn_id)s,
            '{MessageStatus.complete.value}', %(text)s, %(client_message_id)s,
            CAST(%(file_ids)s AS jsonb), %(token_count)s, %(token_counter)s)
        RETURNING created_at
    ), new_turn AS (
        INSERT INTO turns (id, session_id, tenant_id, user_id, user_message_id, user_seq, state,
            last_event_id, viewers)
        VALUES (%(turn_id)s, %(session_id)s, %(tenant_id)s, %(user_id)s, %(message_id)s,
            %(seq)s, '{TurnState.received.value}', 1, 0)
        RETURNING id
    ), first_event AS (
        INSERT INTO turn_events (turn_id, id, type, data)
        VALUES (%(turn_id)s, 1, %(event_type)s, CAST(%(event_data)s AS jsonb))
        RETURNING id
    ), moved_session AS (
        UPDATE sessions SET last_seq = %(seq)s, active_turn_id = %(turn_id)s
        WHERE id = %(session_id)s
        RETURNING id
    )
    SELECT new_message.created_at, pg_notify('{NOTIFY_CHANNEL}', %(notify)s)
    FROM new_message, new_turn, first_event, moved_session
"""
