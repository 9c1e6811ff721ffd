"""A session's messages: the seq rule, written once, and a turn's messages stored with it.

A session's messages are numbered 1, 2, 3… without gaps, in the order they joined the
conversation; the session row's `last_seq` is the last number given. A writer takes the next
one under the session row's lock, which it holds until its transaction ends, so two
messages never share a seq. The lock is taken by the UPDATE that moves `last_seq`, or was
taken before (store/sessions.py `lock_session`) by a writer that read `last_seq` under it.

The rule in its three forms, each for one style of writer:

- `next_seq`: the seq after `last_seq` a writer read under the lock (store/turns/birth.py,
  store/queue.py promoting a queued turn, and the provisional seq of a queued turn), with
  `SEQ_TAKEN`, the session's counter set to it in the writer's own UPDATE of the session;
- `take_seqs`: a run of seqs at once, for an import of earlier messages (store/imports.py);
- `seq_taken`: a statement's `seq` CTE that takes the next seq unless the message is stored
  already (a retry), for the one-statement writers of a turn's messages (`append_message`
  here, store/turns/tool_calls.py `store_tool_result`, store/turns/attempts.py
  `record_tool_requests`, store/posting.py joining a user's message to an open turn).

`append_message` stores a message of a turn's (`MessageRow`, read back by `MESSAGE`) with
its token count (`token_count`, which every stored message carries).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg.types.json import Jsonb

from parley.contracts import MessageStatus
from parley.store.db import Db
from parley.tokens import count_message, default_counter


def next_seq(last_seq: int) -> int:
    """The seq the session's next message takes after `last_seq`."""
    return last_seq + 1


# In an UPDATE of the session's row: its counter set to the seq its new message took
# (parameter `seq`, from `next_seq`).
SEQ_TAKEN = "last_seq = %(seq)s"


def seq_taken(
    *, session: str, message: str, joined: str = "", steer: bool = False, sets: str = ""
) -> str:
    """A `seq` CTE returning the session (`id`), the seq its message takes (`last_seq`), the
    session's active branch (`branch`, which the message joins) and its last own event
    (`last_event_id`): no row when the message (its id, `message`) is stored already.
    `session`: the session's id in SQL, from `joined` (a `FROM` list) when that names it.
    `steer`: the message steers the running turn, and the session's steer doorbell takes its
    seq (store/steering.py). `sets`: more of the session's columns the same UPDATE sets (a
    user's message announced on the session's log: store/live.py `COUNTED`)."""
    more = ", steer_seq = sessions.last_seq + 1" if steer else ""
    more += f", {sets}" if sets else ""
    return f"""seq AS (
        UPDATE sessions SET last_seq = sessions.last_seq + 1{more}
        {joined}
        WHERE sessions.id = {session}
            AND NOT EXISTS (SELECT 1 FROM messages WHERE id = {message})
        RETURNING sessions.id, sessions.last_seq, sessions.branch, sessions.last_event_id
    )"""


# A turn's message inserted at the seq the statement's `seq` CTE took (`seq_taken`, or the
# writer's own UPDATE of the session with `SEQ_TAKEN`, returning its id, `last_seq` and
# `branch`), on the session's active branch (store/branches.py): no row
# when that CTE found the message stored already (a retry). Its parameters are
# `message_params`'. Written once, composed by the one-statement writers of a turn's messages:
# `append_message` here, store/turns/tool_calls.py `store_tool_result` (a call's result as a
# `tool` message), store/turns/attempts.py `record_tool_requests` (a reply asking for tools)
# and store/posting.py and store/queue.py (a user's message joining an open turn, a queued
# turn's message joining at its promotion), and store/handoffs.py (a message of a conversation
# a person holds: the customer's, or the agent's, under their name; no turn).
MESSAGE_AT_SEQ = """INSERT INTO messages
        (id, session_id, seq, role, turn_id, status, text, tool_calls, tool_call_id,
        client_message_id, file_ids, token_count, token_counter, branch, author_name)
    SELECT %(message_id)s, seq.id, seq.last_seq, %(role)s, %(turn_id)s, %(message_status)s,
        %(text)s, CAST(%(tool_calls)s AS jsonb), %(tool_call_id)s, %(client_message_id)s,
        CAST(%(file_ids)s AS jsonb), %(token_count)s, %(token_counter)s, seq.branch,
        %(author_name)s
    FROM seq"""


def message_params(
    *,
    message_id: str,
    turn_id: str | None,
    role: str,
    text: str,
    status: MessageStatus = MessageStatus.complete,
    tool_calls: list[dict[str, Any]] | None = None,
    tool_call_id: str | None = None,
    client_message_id: str | None = None,
    file_ids: list[str] | None = None,
    author_name: str | None = None,
) -> dict[str, Any]:
    """`MESSAGE_AT_SEQ`'s parameters, the message's token count among them (`tool_call_id`:
    the provider's id of the call a `tool` message answers; `client_message_id` and
    `file_ids`: a user's message's key and attachments; `author_name`: a person's reply)."""
    return {
        "message_id": message_id,
        "turn_id": turn_id,
        "role": role,
        "message_status": status.value,
        "text": text,
        "tool_calls": None if tool_calls is None else Jsonb(tool_calls),
        "tool_call_id": tool_call_id,
        "client_message_id": client_message_id,
        "file_ids": None if file_ids is None else Jsonb(file_ids),
        "author_name": author_name,
        **token_count(role, text, tool_calls),
    }


async def take_seqs(conn: Db, *, session_id: str, count: int) -> int:
    """The session's next `count` seqs, returning the first (the caller holds the session
    row's lock): `last_seq` moves on by what is taken, so seqs stay dense."""
    last = await conn.value(_TAKE_SEQS, {"session_id": session_id, "count": count})
    return int(last) - count + 1


_TAKE_SEQS = """
    UPDATE sessions SET last_seq = last_seq + %(count)s WHERE id = %(session_id)s
    RETURNING last_seq
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
    # A person's reply in a conversation handed to the support team (store/handoffs.py).
    author_name: str | None = None


MESSAGE_COLUMNS = (
    "id, seq, role, turn_id, status, text, tool_calls, tool_call_id, created_at, author_name"
)


async def append_message(
    conn: Db,
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
        "session_id": session_id,
        **message_params(
            message_id=message_id,
            turn_id=turn_id,
            role=role,
            text=text,
            status=status,
            tool_calls=tool_calls,
        ),
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
    WITH {seq_taken(session="%(session_id)s", message="%(message_id)s")}
    {MESSAGE_AT_SEQ}
    RETURNING {MESSAGE_COLUMNS}
"""
MESSAGE = f"SELECT {MESSAGE_COLUMNS} FROM messages WHERE id = %(id)s"
