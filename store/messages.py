"""A message's place in its session: the seq rule, written once.

A session's messages are numbered 1, 2, 3… without gaps, in the order they joined the
conversation; the session row's `last_seq` is the last number given. A writer takes the next
one under the session row's lock, which it holds until its transaction ends, so two
messages never share a seq. The lock is taken by the UPDATE that moves `last_seq`, or was
taken before (store/sessions.py `lock_session`) by a writer that read `last_seq` under it.

The rule in its three forms, each for one style of writer:

- `next_seq`: the seq after `last_seq` a writer read under the lock (store/new_turn.py, and
  the provisional seq of a queued turn, store/queue.py), with `SEQ_TAKEN`, the session's
  counter set to it in the writer's own UPDATE of the session;
- `take_seq`: the same on the session's ORM row, written at the next flush (store/posting.py
  joining a turn, store/queue.py promoting one);
- `take_seqs`: a run of seqs at once, for an import of earlier messages (store/imports.py);
- `seq_taken`: a statement's `seq` CTE that takes the next seq unless the message is stored
  already (a retry), for the one-statement writers of a turn's messages
  (store/turn_rows.py `append_message` and `store_tool_result`, store/attempts.py
  `record_tool_requests`).
"""

from __future__ import annotations

from parley.store.db import Conn
from parley.store.models import ChatSession


def next_seq(last_seq: int) -> int:
    """The seq the session's next message takes after `last_seq`."""
    return last_seq + 1


def take_seq(session: ChatSession) -> int:
    """The next seq, taken on the session's ORM row (locked by the caller's transaction)."""
    session.last_seq = next_seq(session.last_seq)
    return session.last_seq


# In an UPDATE of the session's row: its counter set to the seq its new message took
# (parameter `seq`, from `next_seq`).
SEQ_TAKEN = "last_seq = %(seq)s"


def seq_taken(*, session: str, message: str, joined: str = "") -> str:
    """A `seq` CTE returning the session (`id`) and the seq its message takes (`last_seq`):
    no row when the message (its id, `message`) is stored already. `session`: the session's
    id in SQL, from `joined` (a `FROM` list) when that names it."""
    return f"""seq AS (
        UPDATE sessions SET last_seq = sessions.last_seq + 1
        {joined}
        WHERE sessions.id = {session}
            AND NOT EXISTS (SELECT 1 FROM messages WHERE id = {message})
        RETURNING sessions.id, sessions.last_seq
    )"""


async def take_seqs(conn: Conn, *, session_id: str, count: int) -> int:
    """The session's next `count` seqs, returning the first (the caller holds the session
    row's lock): `last_seq` moves on by what is taken, so seqs stay dense."""
    last = await conn.value(_TAKE_SEQS, {"session_id": session_id, "count": count})
    return int(last) - count + 1


_TAKE_SEQS = """
    UPDATE sessions SET last_seq = last_seq + %(count)s WHERE id = %(session_id)s
    RETURNING last_seq
"""
