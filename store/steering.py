"""Steering a running turn (issue 42): a message sent with `"mode": "steer"` while the
session's turn runs joins that turn instead of queueing behind it (store/posting.py).

The session row holds the steer's doorbell, `steer_seq`: the seq of the newest steering
message, set by the statement that stores that message (under the session's lock, like every
seq). Seqs only grow, so "a steer this step has not seen" is `steer_seq` above the one the
step's request was built with (`request["steer_seq"]`, store/context.py). Its readers:

- a model call's stream (store/events.py: every delta's append, and the quiet check, read
  it in the same round trip as the Stop): a newer steer stops the stream, and its partial
  text is kept as superseded (activities/turn.py);
- the context build (activities/context.py): the request records the steer it was built
  with, and the build that takes a newer one announces it (`steered`, `announce_steer`);
- the turn's ending (store/turns/endings.py): the session is released only when no steer
  came after the turn's last model call; otherwise the ending refuses (`TurnSteered`), and
  the workflow answers the steer before the turn ends.

Nothing here commits (see `store`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from parley.contracts import EventType, TurnState
from parley.ids import message_id_for_call, new_id
from parley.live import SessionEventType
from parley.statuses import FinishReason
from parley.store.db import Db
from parley.store.events import STEER_SEQ_OF_SESSION, append_event
from parley.store.live import COUNTED, announce_params, joined_row, joining
from parley.store.messages import (
    MessageRow,
    message_params,
    seq_taken,
)
from parley.wire import SteeredData

__all__ = [
    "STEERABLE",
    "STEER_SEQ_OF_SESSION",
    "TurnSteered",
    "announce_steer",
    "is_newer",
    "join_as_steer",
    "steer_texts",
]


class TurnSteered(Exception):
    """A steer came in after the turn's last model call: the turn may not end before it has
    answered it (the ending is not stored; the workflow calls the model again)."""

    def __init__(self, turn_id: str) -> None:
        super().__init__(f"turn {turn_id} was steered after its last model call")
        self.turn_id = turn_id


def is_newer(steer_seq: int | None, seen: int | None) -> bool:
    """Whether the session's doorbell (`steer_seq`) rings for a step built having seen
    `seen` (None: built before any steer in the session)."""
    return steer_seq is not None and steer_seq > (seen or 0)


# A running turn that can take a steer: not started yet (its first build reads it), building,
# streaming, running tools or sending a confirmed action. One resting on a card or on a
# specialist's question takes the message as a post without the mode does.
STEERABLE = frozenset(
    {
        TurnState.received,
        TurnState.building_context,
        TurnState.calling_model,
        TurnState.executing_tools,
        TurnState.executing_action,
    }
)


async def join_as_steer(
    db: Db, session_id: str, turn_id: str, client_message_id: str, text: str
) -> MessageRow:
    """The user's message, with the session's next seq, joined to the running turn, and the
    session's doorbell set to it: one statement. The session's row is locked by the
    caller's transaction already (store/posting.py)."""
    params = {
        "session_id": session_id,
        **message_params(
            message_id=new_id("msg"),
            turn_id=turn_id,
            role="user",
            text=text,
            client_message_id=client_message_id,
        ),
    }
    # Told on the session's own log too (store/live.py): every tab shows the message.
    params |= announce_params(SessionEventType.message, message_id=params["message_id"])
    message = await db.made(_JOIN_AS_STEER, params, joined_row)
    assert message is not None
    return message


_JOIN_AS_STEER = joining(
    seq_taken(session="%(session_id)s", message="%(message_id)s", steer=True, sets=COUNTED)
)


async def steer_texts(db: Db, *, turn_id: str, after: int) -> list[str]:
    """The texts of the messages that steered the turn after seq `after`, in order: what the
    input screen checks when a step takes them."""
    found = await db.value(_STEER_TEXTS, {"turn_id": turn_id, "after": after})
    return list(found or [])


_STEER_TEXTS = """
    SELECT array_agg(m.text ORDER BY m.seq) FROM messages AS m JOIN turns AS t ON t.id = m.turn_id
    WHERE t.id = %(turn_id)s AND m.role = 'user' AND m.id <> t.user_message_id
        AND m.seq > %(after)s
"""


@dataclass(frozen=True)
class _Before:
    """The turn's model call before the step being built, as the steer's announcement
    needs it; all None when the step is the turn's first."""

    id: str | None
    finish_reason: str | None
    steer_seq: Any
    steer_message_id: str | None


async def announce_steer(
    db: Db, *, turn_id: str, session_id: str, user_seq: int, step: int, steer_seq: int | None
) -> None:
    """The build of `step` takes the session's newest steer (`steer_seq`, as it read it):
    when no earlier step of the turn took it, append `steered`, naming the steering message
    and the call it stopped (the previous step, when its stream was stopped for it). In the
    build's transaction, which stores the step's call: a build run again finds the call and
    announces nothing more."""
    if not is_newer(steer_seq, user_seq):
        return  # no steer since the turn's message
    params = {"turn_id": turn_id, "step": step, "session_id": session_id, "seq": steer_seq}
    before = await db.row(_BEFORE, params, _Before)
    assert before is not None  # a select list without FROM: always one row
    seen = before.steer_seq if isinstance(before.steer_seq, int) else user_seq
    if not is_newer(steer_seq, seen) or before.steer_message_id is None:
        return
    stopped = before.id is not None and before.finish_reason == FinishReason.steered
    data = SteeredData(
        message_id=before.steer_message_id,
        superseded_message_id=message_id_for_call(before.id) if stopped and before.id else None,
    )
    await append_event(db, turn_id=turn_id, type=EventType.steered, data=data)


_BEFORE = """
    SELECT c.id, c.finish_reason, c.request -> 'steer_seq' AS steer_seq,
        (SELECT id FROM messages WHERE session_id = %(session_id)s AND seq = %(seq)s)
            AS steer_message_id
    FROM (SELECT 1) AS one
    LEFT JOIN LATERAL (
        SELECT id, finish_reason, request FROM model_calls
        WHERE turn_id = %(turn_id)s AND step < %(step)s ORDER BY step DESC LIMIT 1
    ) AS c ON true
"""
