"""A turn's rows as the steps read and write them on a `Conn` (store/db.py): the turn
(`TurnRow`, `TurnFacts`), its tool calls (`ToolCallRow`, and the one write of a call's
outcome), its messages (`MessageRow`, `append_message`), and the bookkeeping every ending
does (`close_out`). store/turns.py decides when they are written."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, ClassVar

from psycopg.types.json import Jsonb
from pydantic import BaseModel
from sqlalchemy.ext.asyncio import AsyncSession

from parley.contracts import EventType, MessageStatus, TurnState
from parley.ids import tool_result_message_id
from parley.resolver import Slot
from parley.statuses import ActionStatus, FinalizeOutcome, ToolCallStatus
from parley.store import queue
from parley.store.db import Conn, session_conn
from parley.store.events import DOORBELL, EVENTS_INSERTED, append_params, counter
from parley.store.messages import seq_taken
from parley.store.summaries import BACKLOG_OF_SESSION, Backlog, parse_backlog
from parley.tokens import count_message, default_counter


@dataclass(frozen=True)
class TurnRow:
    """A turn as a step reads it: what decides whether the step may run."""

    id: str
    session_id: str
    state: str
    cancel_requested_at: datetime | None
    assistant_message_id: str | None
    # The turn this one retries (its unfinished answer gives way to this one's).
    retry_of: str | None

    # The columns, in a statement that reads the turn as `t` (each named `t_<field>`).
    COLUMNS: ClassVar[str] = (
        "t.id AS t_id, t.session_id AS t_session_id, t.state AS t_state,"
        " t.cancel_requested_at AS t_cancel_requested_at,"
        " t.assistant_message_id AS t_assistant_message_id, t.retry_of AS t_retry_of"
    )

    @classmethod
    def from_columns(cls, columns: dict[str, Any]) -> TurnRow:
        """The turn from a row that holds `COLUMNS` among others."""
        return cls(**{k[2:]: v for k, v in columns.items() if k.startswith("t_")})


@dataclass(frozen=True)
class TurnFacts:
    """A turn as the steps after its start read it: whom it serves and what it answers.
    Read-only: a step that moves the turn does so through store/turns.py."""

    id: str
    session_id: str
    tenant_id: str
    user_id: str
    user_message_id: str
    user_seq: int
    state: str
    cancel_requested_at: datetime | None
    resolution: dict[str, Any] | None
    # The turn this one retries (its unfinished answer is hidden from this one's window).
    retry_of: str | None

    COLUMNS: ClassVar[str] = (
        "id, session_id, tenant_id, user_id, user_message_id, user_seq, state,"
        " cancel_requested_at, resolution, retry_of"
    )


async def turn_facts(conn: Conn, *, turn_id: str, lock: bool = False) -> TurnFacts | None:
    """The turn as it stands now (`lock`: its row locked until the caller's transaction
    ends), or None for an unknown id."""
    return await conn.row(_TURN_FACTS_LOCKED if lock else _TURN_FACTS, {"id": turn_id}, TurnFacts)


_TURN_FACTS = f"SELECT {TurnFacts.COLUMNS} FROM turns WHERE id = %(id)s"
_TURN_FACTS_LOCKED = f"SELECT {TurnFacts.COLUMNS} FROM turns WHERE id = %(id)s FOR UPDATE"


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
    conn: Conn,
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
        "turn_id": call.turn_id,
        "id": call.id,
        "pending": ToolCallStatus.pending.value,
        "status": status.value,
        "result": Jsonb(result),
        "attempts": attempts,
        "message_id": tool_result_message_id(tool_call_id=call.id),
        "complete": MessageStatus.complete.value,
        "text": text,
        "provider_call_id": call.provider_call_id,
        **token_count("tool", text),
        "slot": name,
        "value": None if slot is None else Jsonb(slot.value),
        "source": None if slot is None else slot.source,
        "set_at_seq": None if slot is None else slot.set_at_seq,
    }
    return await conn.row(_STORE_TOOL_RESULT, params, ToolCallRow)


# The turn's row is locked first, then the session's (its seq): the order of every writer
# of store/turns.py. The main query reads what the UPDATE returned, never the table.
_STORE_TOOL_RESULT = f"""
    WITH turn AS (
        SELECT session_id FROM turns WHERE id = %(turn_id)s FOR UPDATE
    ), stored AS (
        UPDATE tool_calls SET status = %(status)s, result = %(result)s,
            attempts = COALESCE(CAST(%(attempts)s AS integer), attempts), completed_at = now()
        FROM turn
        WHERE tool_calls.id = %(id)s AND tool_calls.status = %(pending)s
        RETURNING tool_calls.*, turn.session_id
    ), {seq_taken(session="stored.session_id", message="%(message_id)s", joined="FROM stored")},
    message AS (
        INSERT INTO messages
            (id, session_id, seq, role, turn_id, status, text, tool_call_id, token_count,
            token_counter)
        SELECT %(message_id)s, seq.id, seq.last_seq, 'tool', %(turn_id)s, %(complete)s,
            %(text)s, %(provider_call_id)s, %(token_count)s, %(token_counter)s
        FROM seq
    ), referent AS (
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


@dataclass(frozen=True)
class MessageRow:
    """A stored message, as the stream shows it (`MessageView.from_row`)."""

    id: str
    seq: int
    role: str
    turn_id: str | None
    status: str
    text: str
    tool_calls: list[dict[str, Any]] | None
    tool_call_id: str | None
    created_at: datetime


MESSAGE_COLUMNS = "id, seq, role, turn_id, status, text, tool_calls, tool_call_id, created_at"


async def append_message(
    conn: Conn,
    *,
    session_id: str,
    turn_id: str,
    message_id: str,
    role: str,
    text: str,
    status: MessageStatus = MessageStatus.complete,
    tool_calls: list[dict[str, Any]] | None = None,
) -> MessageRow:
    """Store a message of the turn's with the session's next seq, unless it is stored
    already (a retry), which is then returned as it is: one statement takes the seq (locking
    the session row until the commit) and inserts the message."""
    params = {
        "id": message_id,
        "session_id": session_id,
        "turn_id": turn_id,
        "role": role,
        "status": status.value,
        "text": text,
        "tool_calls": None if tool_calls is None else Jsonb(tool_calls),
        **token_count(role, text, tool_calls),
    }
    found = await conn.row(_APPEND_MESSAGE, params, MessageRow)
    if found is None:
        found = await conn.row(MESSAGE, {"id": message_id}, MessageRow)
        assert found is not None, f"session {session_id} is missing"
    return found


def token_count(
    role: str, text: str, tool_calls: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """The token count every stored message carries (as `store.models.count_tokens`)."""
    counter = default_counter()
    message = {"role": role, "content": text, "tool_calls": tool_calls}
    return {"token_count": count_message(counter, message), "token_counter": counter.name}


_APPEND_MESSAGE = f"""
    WITH {seq_taken(session="%(session_id)s", message="%(id)s")}
    INSERT INTO messages
        (id, session_id, seq, role, turn_id, status, text, tool_calls, token_count,
        token_counter)
    SELECT %(id)s, %(session_id)s, seq.last_seq, %(role)s, %(turn_id)s, %(status)s,
        %(text)s, CAST(%(tool_calls)s AS jsonb), %(token_count)s, %(token_counter)s
    FROM seq
    RETURNING {MESSAGE_COLUMNS}
"""
MESSAGE = f"SELECT {MESSAGE_COLUMNS} FROM messages WHERE id = %(id)s"


async def retract_message(conn: Conn, *, message_id: str, text: str) -> MessageRow:
    """A stored answer withdrawn: only the safe `text` is kept, marked `retracted`."""
    params = {"id": message_id, "text": text, **token_count("assistant", text)}
    found = await conn.row(_RETRACT_MESSAGE, params, MessageRow)
    assert found is not None, f"message {message_id} is missing"
    return found


async def replace_retried_answer(conn: Conn, *, retry_of: str, answer: str) -> None:
    """The retried turn's unfinished answer gives way to the new one."""
    await conn.run(_REPLACE_RETRIED, {"retry_of": retry_of, "answer": answer})


_RETRACT_MESSAGE = f"""
    UPDATE messages SET text = %(text)s, status = '{MessageStatus.retracted.value}',
        token_count = %(token_count)s, token_counter = %(token_counter)s
    WHERE id = %(id)s
    RETURNING {MESSAGE_COLUMNS}
"""
_REPLACE_RETRIED = """
    UPDATE messages SET replaced_by = %(answer)s
    WHERE id = (SELECT assistant_message_id FROM turns WHERE id = %(retry_of)s)
        AND replaced_by IS NULL
"""


async def store_answer(
    conn: Conn,
    turn: TurnRow,
    message_id: str,
    text: str,
    outcome: FinalizeOutcome,
    retracted: bool,
) -> MessageRow:
    """The message a turn's finalize ends with: the answer stored (as it was, when an
    earlier attempt stored it), or the turn's last message when the user moved on."""
    if outcome == FinalizeOutcome.superseded:
        assert turn.assistant_message_id is not None
        found = await conn.row(MESSAGE, {"id": turn.assistant_message_id}, MessageRow)
        assert found is not None
        return found
    # Retracted: only the safe text is kept; the withdrawn answer is not stored anywhere visible.
    status = MessageStatus.retracted if retracted else MessageStatus.complete
    message = await append_message(
        conn,
        session_id=turn.session_id,
        turn_id=turn.id,
        message_id=message_id,
        role="assistant",
        text=text,
        status=status,
    )
    if message.status != status:  # stored by an earlier attempt, before the retraction
        message = await retract_message(conn, message_id=message.id, text=text)
    return message


async def close_out(db: AsyncSession, *, session_id: str, turn_id: str, reason: str) -> None:
    """An ending's bookkeeping, in one statement: the session may take a new turn (its row is
    locked like by every other writer of it), and a proposal the turn never got to ask about
    (it hit its bounds, or failed) must not stay pending. A turn queued behind this one is
    promoted in the same transaction (store/queue.py)."""
    conn = await session_conn(db)
    queued = await conn.value(_CLOSE_OUT, _close_out_params(session_id, turn_id, reason))
    if queued is not None:
        await queue.promote(db, session_id=session_id, turn_id=queued)


async def close_out_announced(
    db: AsyncSession,
    *,
    session_id: str,
    turn_id: str,
    reason: str,
    events: Sequence[tuple[EventType, BaseModel]],
    moving_to: TurnState,
    answer: str,
    backlog: bool = False,
) -> Backlog | None:
    """`close_out` and the ending's announcement (`store.events.append_events` moving the
    turn to `moving_to`, its answer `answer`), in one statement, in the caller's transaction:
    the turn's row is locked by the caller already, the session's next.

    With `backlog`, the same statement reads what the rolling summary's check asks
    (store/summaries.py `summary_backlog`), as the transaction leaves it, and returns it;
    None when a queued turn is promoted after it (its message joins the backlog then)."""
    conn = await session_conn(db)
    params = {
        **_close_out_params(session_id, turn_id, reason),
        **append_params(turn_id, events, moving_to, answer),
    }
    closed = await conn.made(_CLOSE_OUT_ANNOUNCED, {**params, "backlog": backlog}, _ClosedOut)
    assert closed is not None  # an aggregate's one row
    if closed.queued is not None:
        await queue.promote(db, session_id=session_id, turn_id=closed.queued)
        return None
    return parse_backlog(closed.backlog)


@dataclass(frozen=True)
class _ClosedOut:
    queued: str | None
    notified: Any
    backlog: list[Any] | None


def _close_out_params(session_id: str, turn_id: str, reason: str) -> dict[str, Any]:
    return {
        "session_id": session_id,
        "turn_id": turn_id,
        "declined": ActionStatus.declined.value,
        "pending": ActionStatus.pending.value,
        "reason": str(reason),
        "now": datetime.now(UTC),
    }


# Plain SQL: every turn ends through it, and no caller holds the rows it changes. RETURNING
# reads the session row as locked (the newest version), never a snapshot that could miss a
# message queued just before.
_RELEASED_AND_DECLINED = """
    WITH released AS (
        UPDATE sessions SET active_turn_id = NULL
        WHERE id = %(session_id)s AND active_turn_id = %(turn_id)s
        RETURNING queued_turn_id
    ), declined AS (
        UPDATE actions SET status = %(declined)s, decline_reason = %(reason)s,
            resolved_at = %(now)s
        WHERE turn_id = %(turn_id)s AND status = %(pending)s
    )"""
_CLOSE_OUT = f"""{_RELEASED_AND_DECLINED}
    SELECT queued_turn_id FROM released
"""
# `_CLOSE_OUT` and `store.events`' append moving the turn (its `counter`, `inserted` and
# doorbell) in one statement. The append's row is the turn's, the release's the session's:
# no row is written twice. `queued_turn_id` comes back beside the doorbell's columns, and,
# when asked for, the session's backlog (its subquery runs only then): the statement's
# writes do not touch what it reads, and the answer it closes out was stored by an earlier
# statement of the transaction, so the answer is in it.
_CLOSE_OUT_ANNOUNCED = f"""{_RELEASED_AND_DECLINED}, {counter(moving=True)}, {EVENTS_INSERTED}
    SELECT (SELECT queued_turn_id FROM released) AS queued, {DOORBELL} AS notified,
        CASE WHEN %(backlog)s THEN {BACKLOG_OF_SESSION} END AS backlog
    FROM inserted
"""
