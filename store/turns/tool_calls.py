"""A turn's tool calls as stored (`ToolCallRow`), and the one write of a call's outcome:
its result, its `tool` message in the transcript and, for a result set, the slot it makes
the conversation's referent. The calls themselves are written with the reply that asks for
them (store/turns/attempts.py `record_tool_requests`)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any, ClassVar

from psycopg.types.json import Jsonb

from parley.ids import tool_result_message_id
from parley.resolver import Slot
from parley.statuses import ToolCallStatus
from parley.store.db import Db
from parley.store.messages import MESSAGE_AT_SEQ, message_params, seq_taken
from parley.store.turns.reads import TURN_LOCKED


@dataclass(frozen=True)
class ToolCallRow:
    """A tool call as stored: what the model asked for, and what server code made of it.
    Read-only: its outcome is written once, by `store_tool_result`."""

    id: str
    turn_id: str
    model_call_id: str
    # The id the provider gave the call; unique only within its model call.
    provider_call_id: str
    name: str
    arguments: Any
    args_hash: str
    status: str
    result: dict[str, Any] | None
    attempts: int
    completed_at: datetime | None

    COLUMNS: ClassVar[str] = (
        "id, turn_id, model_call_id, provider_call_id, name, arguments, args_hash, status,"
        " result, attempts, completed_at"
    )


async def store_tool_result(
    conn: Db,
    *,
    call: ToolCallRow,
    status: ToolCallStatus,
    result: dict[str, Any],
    attempts: int | None = None,
    referent: tuple[str, Slot] | None = None,
) -> ToolCallRow | None:
    """Record a pending tool call's outcome (and how many attempts it took, when given),
    append it to the transcript as a `tool` message and, with a `referent`, make that what
    the conversation is about (the slot is written unless it holds that value already): one
    statement, in the caller's transaction. The call as stored, or None when it was no longer
    pending (an earlier attempt stored its outcome, and that one stands)."""
    text = json.dumps({"name": call.name, "result": result}, sort_keys=True)
    name, slot = referent or (None, None)
    params = {
        **message_params(
            message_id=tool_result_message_id(tool_call_id=call.id),
            turn_id=call.turn_id,
            role="tool",
            text=text,
            tool_call_id=call.provider_call_id,
        ),
        "id": call.id,
        "pending": ToolCallStatus.pending.value,
        "status": status.value,
        "result": Jsonb(result),
        "attempts": attempts,
        "slot": name,
        "value": None if slot is None else Jsonb(slot.value),
        "source": None if slot is None else slot.source,
        "set_at_seq": None if slot is None else slot.set_at_seq,
    }
    return await conn.row(_STORE_TOOL_RESULT, params, ToolCallRow)


# The turn's row is locked first, then the session's (its seq): the order of every writer
# of store/turns.py. The main query reads what the UPDATE returned, never the table.
_STORE_TOOL_RESULT = f"""
    WITH {TURN_LOCKED}, stored AS (
        UPDATE tool_calls SET status = %(status)s, result = %(result)s,
            attempts = COALESCE(CAST(%(attempts)s AS integer), attempts), completed_at = now()
        FROM turn
        WHERE tool_calls.id = %(id)s AND tool_calls.status = %(pending)s
        RETURNING tool_calls.*, turn.session_id
    ), {seq_taken(session="stored.session_id", message="%(message_id)s", joined="FROM stored")},
    message AS ({MESSAGE_AT_SEQ}), referent AS (
        INSERT INTO slots (session_id, name, value, source, set_at_seq)
        SELECT stored.session_id, CAST(%(slot)s AS text), CAST(%(value)s AS jsonb),
            CAST(%(source)s AS text), CAST(%(set_at_seq)s AS integer)
        FROM stored WHERE CAST(%(slot)s AS text) IS NOT NULL
        ON CONFLICT (session_id, name) DO UPDATE
        SET value = EXCLUDED.value, source = EXCLUDED.source, set_at_seq = EXCLUDED.set_at_seq
        WHERE slots.value IS DISTINCT FROM EXCLUDED.value
    )
    SELECT {ToolCallRow.COLUMNS} FROM stored
"""
