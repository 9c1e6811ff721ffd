"""What a turn's ending writes, on the ending's connection: the answer it ends with
(`store_answer`, or withdrawn: `retract_message`; a retried turn's answer giving way,
`replace_retried_answer`) and the bookkeeping every ending does (`close_out`, and with its
announcement, `close_out_announced`). `parley.store.turns` decides which ending a turn
takes and when these run."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel

from parley.contracts import EventType, MessageStatus, TurnState
from parley.statuses import ActionStatus, FinalizeOutcome
from parley.store import queue
from parley.store.db import Db
from parley.store.events import DOORBELL, EVENTS_INSERTED, append_params, counter
from parley.store.messages import MESSAGE, MESSAGE_COLUMNS, MessageRow, append_message, token_count
from parley.store.steering import TurnSteered, is_newer
from parley.store.summaries import BACKLOG_OF_SESSION, Backlog, parse_backlog
from parley.store.turns.reads import TurnRow


async def retract_message(conn: Db, *, message_id: str, text: str) -> MessageRow:
    """A stored answer withdrawn: only the safe `text` is kept, marked `retracted`."""
    params = {"id": message_id, "text": text, **token_count("assistant", text)}
    found = await conn.row(_RETRACT_MESSAGE, params, MessageRow)
    assert found is not None, f"message {message_id} is missing"
    return found


async def replace_retried_answer(conn: Db, *, retry_of: str, answer: str) -> None:
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
    conn: Db,
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


async def close_out(db: Db, *, session_id: str, turn_id: str, reason: str) -> None:
    """An ending's bookkeeping, in one statement: the session may take a new turn (its row is
    locked like by every other writer of it), and a proposal the turn never got to ask about
    (it hit its bounds, or failed) must not stay pending. A turn queued behind this one is
    promoted in the same transaction (store/queue.py)."""
    queued = await db.value(_CLOSE_OUT, _close_out_params(session_id, turn_id, reason))
    if queued is not None:
        await queue.promote(db, session_id=session_id, turn_id=queued)


async def close_out_announced(
    db: Db,
    *,
    session_id: str,
    turn_id: str,
    reason: str,
    events: Sequence[tuple[EventType, BaseModel]],
    moving_to: TurnState,
    answer: str,
    backlog: bool = False,
    steered_through: int | None = None,
) -> Backlog | None:
    """`close_out` and the ending's announcement (`store.events.append_events` moving the
    turn to `moving_to`, its answer `answer`), in one statement, in the caller's transaction:
    the turn's row is locked by the caller already, the session's next.

    `steered_through`: the steer the turn's last model call was built with (store/
    steering.py). The session is released only when no newer steer rang its doorbell (read
    under the session's lock, so a steer is either before the ending or finds no running
    turn); otherwise `TurnSteered`, and the caller rolls the ending back.

    With `backlog`, the same statement reads what the rolling summary's check asks
    (store/summaries.py `summary_backlog`), as the transaction leaves it, and returns it;
    None when a queued turn is promoted after it (its message joins the backlog then)."""
    params = {
        **_close_out_params(session_id, turn_id, reason, steered_through),
        **append_params(turn_id, events, moving_to, answer),
    }
    closed = await db.made(_CLOSE_OUT_ANNOUNCED, {**params, "backlog": backlog}, _ClosedOut)
    assert closed is not None  # an aggregate's one row
    if not closed.released and steered_through is not None:
        # Not released: the session moved on (deleted), or a steer held it (a read of its own,
        # only on this rare path).
        steer_seq = await db.value(_STEER_HOLDS, {"session_id": session_id, "turn_id": turn_id})
        if is_newer(steer_seq, steered_through):
            raise TurnSteered(turn_id)
    if closed.queued is not None:
        await queue.promote(db, session_id=session_id, turn_id=closed.queued)
        return None
    return parse_backlog(closed.backlog)


@dataclass(frozen=True)
class _ClosedOut:
    queued: str | None
    notified: Any
    backlog: list[Any] | None
    released: bool


_STEER_HOLDS = (
    "SELECT steer_seq FROM sessions WHERE id = %(session_id)s AND active_turn_id = %(turn_id)s"
)


def _close_out_params(
    session_id: str, turn_id: str, reason: str, steered_through: int | None = None
) -> dict[str, Any]:
    return {
        "session_id": session_id,
        "turn_id": turn_id,
        "steered_through": steered_through,
        "declined": ActionStatus.declined.value,
        "pending": ActionStatus.pending.value,
        "reason": str(reason),
        "now": datetime.now(UTC),
    }


# Plain SQL: every turn ends through it, and no caller holds the rows it changes. RETURNING
# reads the session row as locked (the newest version), never a snapshot that could miss a
# message queued just before; so does the steer's guard (`steered_through`, null: none).
# A card renewed after its window passed (store/approvals.py) has a wait of its own: the end
# of its turn, which may come just after the renew (the turn's timer fires a moment after
# `expires_at`), leaves it pending.
_RELEASED_AND_DECLINED = """
    WITH released AS (
        UPDATE sessions SET active_turn_id = NULL
        WHERE id = %(session_id)s AND active_turn_id = %(turn_id)s
            AND (CAST(%(steered_through)s AS integer) IS NULL OR sessions.steer_seq IS NULL
                OR sessions.steer_seq <= CAST(%(steered_through)s AS integer))
        RETURNING queued_turn_id
    ), declined AS (
        UPDATE actions SET status = %(declined)s, decline_reason = %(reason)s,
            resolved_at = %(now)s
        WHERE turn_id = %(turn_id)s AND status = %(pending)s AND renewed_from IS NULL
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
        EXISTS (SELECT 1 FROM released) AS released,
        CASE WHEN %(backlog)s THEN {BACKLOG_OF_SESSION} END AS backlog
    FROM inserted
"""
