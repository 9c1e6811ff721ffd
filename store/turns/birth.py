"""A new turn's first write: the user message, the turn (born in `received`, the start
outbox), its `received` event and the session's next seq and active turn, in one statement.

Every plain post runs it, so it is one round trip built once; the caller holds the session's
lock (store/posting.py) and gets typed rows back.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from parley.contracts import MessageStatus, TurnState
from parley.ids import new_id
from parley.live import SessionEventType
from parley.store.db import Db
from parley.store.events import BASE, EVENTS_INSERTED, RUNG, append_params, state_event
from parley.store.identity import Identity
from parley.store.live import COUNTED, LIVE_RUNG, announce_params, announced
from parley.store.messages import SEQ_TAKEN, next_seq, token_count
from parley.store.turn_states import BORN
from parley.wire import MessageView


async def insert_message_and_turn(
    db: Db,
    *,
    session_id: str,
    last_seq: int,
    owner: Identity,
    client_message_id: str,
    text: str,
    attached: Sequence[str],
) -> tuple[MessageView, str]:
    """Write the message and its new turn after `last_seq` (read under the session's lock);
    return the message as the contract shows it and the turn's id. The statement runs in the
    caller's unit of work."""
    turn_id, seq = new_id("trn"), next_seq(last_seq)
    message = {
        "id": new_id("msg"),
        "session_id": session_id,
        "seq": seq,
        "role": "user",
        "turn_id": turn_id,
        "status": MessageStatus.complete,
        "text": text,
        "client_message_id": client_message_id,
        "file_ids": list(attached) or None,
        **token_count("user", text),
    }
    created_at = await db.value(_WRITE, _write_params(message, owner))
    return MessageView.model_validate({**message, "created_at": created_at}), turn_id


def _write_params(message: dict[str, Any], owner: Identity) -> dict[str, Any]:
    first = [state_event(TurnState.received)]
    file_ids = message["file_ids"]
    return {
        **append_params(message["turn_id"], first),
        **announce_params(
            SessionEventType.message, turn_id=message["turn_id"], message_id=message["id"]
        ),
        "to": TurnState.received.value,
        "message_id": message["id"],
        "session_id": message["session_id"],
        "seq": message["seq"],
        "text": message["text"],
        "client_message_id": message["client_message_id"],
        "file_ids": json.dumps(file_ids) if file_ids is not None else None,
        "token_count": message["token_count"],
        "token_counter": message["token_counter"],
        "tenant_id": owner.tenant_id,
        "user_id": owner.user_id,
    }


# Insert the message, the turn (store/turn_states.py `BORN`, as the `counter` of its first
# event's append: store/events.py) and its first event (`received`, rung on the doorbell), and
# move the session on, announcing the message and its turn on the session's own log
# (store/live.py), returning the message's stamp. Plain SQL on psycopg's own connection,
# written once: every plain post runs it.
_WRITE = f"""
    WITH new_message AS (
        INSERT INTO messages (id, session_id, seq, role, turn_id, status, text,
            client_message_id, file_ids, token_count, token_counter, branch)
        VALUES (%(message_id)s, %(session_id)s, %(seq)s, 'user', %(turn_id)s,
            '{MessageStatus.complete.value}', %(text)s, %(client_message_id)s,
            CAST(%(file_ids)s AS jsonb), %(token_count)s, %(token_counter)s,
            (SELECT branch FROM sessions WHERE id = CAST(%(session_id)s AS varchar)))
        RETURNING created_at
    ), counter AS ({BORN} RETURNING {BASE}), {EVENTS_INSERTED}, moved_session AS (
        UPDATE sessions SET {SEQ_TAKEN}, active_turn_id = %(turn_id)s, {COUNTED}
        WHERE id = %(session_id)s
        RETURNING sessions.id, sessions.last_event_id
    ), {announced("moved_session")}
    SELECT new_message.created_at, {RUNG} AS notified, {LIVE_RUNG} AS announced
    FROM new_message, moved_session
"""
