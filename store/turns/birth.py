"""A new turn's first write: the user message, the turn (born in `received`, the start
outbox), its `received` event and the session's next seq and active turn, in one statement;
or, for a message already stored (a retry's, an edit's), the turn alone (`open_turn`).

Every plain post runs it, so it is one round trip built once; the caller holds the session's
lock (store/posting.py) and gets typed rows back.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from parley.contracts import MessageStatus, TurnState
from parley.ids import new_id
from parley.live import SessionEventType, SessionTurnData
from parley.store.db import Db, Sent
from parley.store.events import (
    BASE,
    EVENTS_INSERTED,
    OUTBOX_DOORBELL,
    RUNG,
    OutboxRing,
    append_params,
    state_event,
)
from parley.store.identity import Identity
from parley.store.live import COUNTED, LIVE_RUNG, announce_params, announced
from parley.store.messages import SEQ_TAKEN, MessageRow, next_seq, token_count
from parley.store.turn_states import BORN
from parley.store.turns.reads import PostedTurn
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
    born = await send_message_and_turn(
        db,
        session_id=session_id,
        last_seq=last_seq,
        owner=owner,
        client_message_id=client_message_id,
        text=text,
        attached=attached,
    )
    return await born.made()


@dataclass(frozen=True)
class Born:
    """The write `send_message_and_turn` sent: the message as written, once it is stamped."""

    message: dict[str, Any]
    sent: Sent[tuple[Any, ...]]

    async def made(self) -> tuple[MessageView, str]:
        """The message as the contract shows it, and its turn's id."""
        stamped = await self.sent.row()
        assert stamped is not None, "the message's write returned no row"
        created_at = stamped[0]
        return (
            MessageView.model_validate({**self.message, "created_at": created_at}),
            self.message["turn_id"],
        )


async def send_message_and_turn(
    db: Db,
    *,
    session_id: str,
    last_seq: int,
    owner: Identity,
    client_message_id: str,
    text: str,
    attached: Sequence[str],
    start_on: OutboxRing | None = None,
) -> Born:
    """`insert_message_and_turn`, sent (or queued in `Db.together` with the post's counts);
    read it with `Born.made`. `start_on`: the outbox's ring (its turn id is this turn's),
    heard by the workers at commit; one of them starts the turn (dispatch/outbox.py)."""
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
    params = _write_params(message, owner)
    ring = replace(start_on, turn_id=turn_id) if start_on is not None else None
    params["outbox_ring"] = ring.payload() if ring is not None else None
    return Born(message, await db.send_made(_WRITE, params, _tuple))


def _tuple(**columns: Any) -> tuple[Any, ...]:
    return tuple(columns.values())


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
    SELECT new_message.created_at, {RUNG} AS notified, {LIVE_RUNG} AS announced,
        {OUTBOX_DOORBELL} AS start_rung
    FROM new_message, moved_session
"""


async def open_turn(
    db: Db,
    *,
    session_id: str,
    owner: Identity,
    message: MessageRow,
    turn_id: str | None = None,
    retry_of: str | None = None,
) -> PostedTurn:
    """Create the session's active turn for a user message already stored: the row is the
    outbox the workflow start relies on, and its first event is `received`. A turn is born
    here in `received` (store/turn_states.py `BORN`, with its first event and the session's
    active turn, in one statement); every later state goes through `store.turns.move_turn`.
    `retry_of`: the turn this one retries, written by a statement of its own."""
    turn = PostedTurn(
        turn_id or new_id("trn"), session_id, owner.tenant_id, owner.user_id, TurnState.received
    )
    announcement = SessionTurnData(turn_id=turn.id, retry_of=retry_of)
    params = {
        **append_params(turn.id, [state_event(TurnState.received)]),
        **announce_params(SessionEventType.turn, announcement, turn_id=turn.id),
        "to": TurnState.received.value,
        "session_id": session_id,
        "tenant_id": owner.tenant_id,
        "user_id": owner.user_id,
        "message_id": message.id,
        "seq": message.seq,
    }
    await db.run(_OPEN_TURN, params)
    if retry_of is not None:
        await db.run(_RETRY_OF, {"turn_id": turn.id, "retry_of": retry_of})
    return turn


# Born as the `counter` of its first event's append (store/events.py), the session held and
# its own log told (store/live.py).
_OPEN_TURN = f"""
    WITH counter AS ({BORN} RETURNING {BASE}), {EVENTS_INSERTED}, held AS (
        UPDATE sessions SET active_turn_id = %(turn_id)s, {COUNTED} WHERE id = %(session_id)s
        RETURNING sessions.id, sessions.last_event_id
    ), {announced("held")}
    SELECT {RUNG} AS notified, {LIVE_RUNG} AS announced
"""
_RETRY_OF = "UPDATE turns SET retry_of = %(retry_of)s WHERE id = %(turn_id)s"
