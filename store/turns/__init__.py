"""A turn: its progress and endings, written by the activities (its state, the messages it
stores: tool requests and results, a proposal, the answer; and how it ends), decided here.

The turn's rows are written by its parts, each named by what it is about: `birth` (a plain
post's turn born with its message, in one statement), `reads` (the turn as a step reads it),
`attempts` (a model call's attempt opened, and a reply that asks for tools stored, in one
statement each), `tool_calls` (a tool call's outcome) and `endings` (the answer an ending
stores and the bookkeeping every ending does). Its state's SQL is store/turn_states.py's.

`move_turn` is the one function that changes a stored turn's state; it asks the table in
`parley.turn_states` and refuses a move the table does not allow (store/turn_states.py holds
that check and the SQL of a move, which the one-statement paths compose). Every function
here runs in the caller's transaction and locks the turn row first (then the session row,
when it assigns a seq or releases the session), so retried attempts of a step serialize on
the turn.

A cancel is a decision recorded on the row (`request_cancel`), under the same lock: a step
that starts after it refuses to run (`TurnStopped`), and every ending after it is
`cancelled`. The finalize transaction is the line: before it commits a cancel is accepted
and wins; after it, the turn is finished and the cancel is refused.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from psycopg.types.json import Jsonb
from pydantic import BaseModel

from parley.contracts import TERMINAL_TURN_STATES, EventType, MessageStatus, TurnState
from parley.errors import TurnFinished
from parley.ids import (
    message_id_for_call,
    unfinished_message_fallback_id,
    unfinished_message_id,
)
from parley.statuses import DeclineReason, FinalizeOutcome, ToolCallStatus
from parley.store.db import Db
from parley.store.events import append_events, state_event
from parley.store.messages import MessageRow, append_message
from parley.store.summaries import Backlog
from parley.store.turn_states import Moving, may_enter
from parley.store.turns.endings import (
    close_out,
    close_out_announced,
    replace_retried_answer,
    store_answer,
)
from parley.store.turns.reads import TurnFacts, TurnRow, turn_facts
from parley.store.turns.tool_calls import ToolCallRow, store_tool_result
from parley.wire import (
    ActionData,
    ActionView,
    ErrorData,
    MessageData,
    MessageView,
    RetractedData,
)


async def _lock(db: Db, turn_id: str) -> TurnFacts:
    """The turn's row read and locked (`FOR UPDATE`), as it stands now; LookupError for an
    unknown id."""
    turn = await turn_facts(db, turn_id=turn_id, lock=True)
    if turn is None:
        raise LookupError(turn_id)
    return turn


async def move_turn(
    db: Db,
    *,
    turn_id: str,
    to: TurnState,
    then: Sequence[tuple[EventType, BaseModel]] = (),
) -> bool:
    """Move the turn to `to`, locking its row, and tell the stream (`state`), then show
    `then`, in one statement.

    A repeat of the current state is a no-op (False; `then` is still shown): a retried step
    enters it again. A move the table does not allow raises `IllegalTransition` and changes
    nothing.
    """
    turn = await _lock(db, turn_id)
    return await _announce_move(db, turn, to=to, then=then)


async def _announce_move(
    db: Db,
    turn: Moving,
    *,
    to: TurnState,
    then: Sequence[tuple[EventType, BaseModel]] = (),
) -> bool:
    """Move a turn whose row the caller has locked and tell the stream (`state`), then show
    `then`: the state and the events in one statement (`then` alone for a repeat). The row
    the caller holds is not changed (a typed row cannot be)."""
    moving = may_enter(turn, to)
    events = [state_event(to), *then] if moving else list(then)
    if events:
        await append_events(db, turn_id=turn.id, events=events, moving_to=to if moving else None)
    return moving


class TurnStopped(Exception):
    """The turn ended, or its cancel was recorded, before this step could start: the step
    does nothing and the workflow stops (its ending is stored by whoever ended it)."""

    def __init__(self, turn_id: str, state: str) -> None:
        super().__init__(f"turn {turn_id} is {state}; the step does not run")
        self.turn_id = turn_id
        self.state = state


def _refuse_if_stopped(turn: Moving) -> None:
    if turn.state in TERMINAL_TURN_STATES:
        raise TurnStopped(turn.id, turn.state)
    if turn.cancel_requested_at is not None:
        raise TurnStopped(turn.id, "cancelling")


async def advance_turn(db: Db, *, turn_id: str, to: TurnState) -> TurnFacts:
    """A step of a running turn enters its state (a repeat of it changes nothing), its row
    locked in the caller's transaction, and gets the turn as it now stands. A turn that
    already ended or whose cancel was recorded raises `TurnStopped`: the step must not run
    (a cancelled turn never calls the model, runs a tool or sends again). On a `Db`, or in
    a session's transaction."""
    turn = await turn_facts(db, turn_id=turn_id, lock=True)
    if turn is None:
        raise LookupError(turn_id)
    await advance_locked(db, turn, to=to)
    return replace(turn, state=to)


async def advance_locked(
    db: Db,
    turn: Moving,
    *,
    to: TurnState,
    then: Sequence[tuple[EventType, BaseModel]] = (),
) -> None:
    """`advance_turn` for a turn whose row the caller has read `FOR UPDATE` itself (with the
    other rows it needs, in the same statement), in the caller's transaction. `then`: events
    the step shows after entering its state, appended in the same statement."""
    _refuse_if_stopped(turn)
    await _announce_move(db, turn, to=to, then=then)


def may_move(turn: Moving, *, to: TurnState) -> bool:
    """What `advance_locked` checks before it moves a turn, for a caller whose own statement
    made (or was guarded from making) the move: `TurnStopped` for an ended or stopped turn,
    False for a repeat of its state, `IllegalTransition` for a move the table does not allow."""
    _refuse_if_stopped(turn)
    return may_enter(turn, to)


async def request_cancel(db: Db, *, turn_id: str) -> None:
    """Record the user's Stop once. A finished turn refuses (`TurnFinished`): its ending is
    already stored and will not change. Repeating a cancel is harmless."""
    turn = await _lock(db, turn_id)
    if turn.state in TERMINAL_TURN_STATES:
        raise TurnFinished(f"the turn is already {turn.state}", state=turn.state)
    if turn.cancel_requested_at is None:
        await db.run(_STOP_RECORDED, {"turn_id": turn_id, "now": datetime.now(UTC)})


_STOP_RECORDED = "UPDATE turns SET cancel_requested_at = %(now)s WHERE id = %(turn_id)s"


async def rest_awaiting_confirmation(
    conn: Db, *, turn_id: str, model_call_id: str, text: str, action: ActionView
) -> None:
    """Store the model's proposal text, then show the confirmation card (`action`) and wait:
    the turn locked, the message, then the move with its events in one statement.

    Idempotent. A turn that ended or is being cancelled never shows a card (`TurnStopped`)."""
    turn = await turn_facts(conn, turn_id=turn_id, lock=True)
    assert turn is not None
    if turn.state == TurnState.awaiting_confirmation:
        return
    _refuse_if_stopped(turn)
    may_enter(turn, TurnState.awaiting_confirmation)
    message = await append_message(
        conn,
        session_id=turn.session_id,
        turn_id=turn_id,
        message_id=message_id_for_call(model_call_id),
        role="assistant",
        text=text,
    )
    await append_events(
        conn,
        turn_id=turn_id,
        events=[
            state_event(TurnState.awaiting_confirmation),
            (EventType.confirmation_required, ActionData(action=action)),
        ],
        moving_to=TurnState.awaiting_confirmation,
        answer=message.id,
    )


async def complete_turn(
    db: Db,
    *,
    turn: TurnRow,
    message_id: str,
    text: str,
    outcome: FinalizeOutcome = FinalizeOutcome.completed,
    retracted: bool = False,
    backlog: bool = False,
    steered_through: int | None = None,
) -> Completed:
    """Store the final assistant message as `message_id`, end the stream with `done`,
    release the session. `turn`: the turn's row, which the caller has locked in the
    session's transaction (`store.steps.lock_with_call`). With `backlog`, the session's
    backlog for the rolling summary's check comes back too, when the ending's last statement
    could read it (`close_out_announced`). `steered_through`: the steer the turn's last model
    call was built with; a newer one refuses the ending (`TurnSteered`, store/steering.py).

    `outcome` expired ends in state expired; superseded stores nothing new (the user moved
    on) and closes the stream with the turn's last message. Idempotent under retries.

    A turn whose cancel was recorded first ends `cancelled` instead and raises `TurnStopped`
    once that is stored (the caller commits, then tells the workflow).
    """
    if turn.state in (TurnState.cancelled, TurnState.failed):
        # Ended by a cancel that raced the answer; the answer must not reappear.
        raise TurnStopped(turn.id, turn.state)
    if turn.cancel_requested_at is not None and turn.state not in TERMINAL_TURN_STATES:
        await end_unfinished_turn(db, turn_id=turn.id, state=TurnState.cancelled)
        raise TurnStopped(turn.id, TurnState.cancelled)
    message = await store_answer(db, turn, message_id, text, outcome, retracted)
    if turn.state in TERMINAL_TURN_STATES:
        return Completed(message)
    final_state = TurnState.expired if outcome == FinalizeOutcome.expired else TurnState.completed
    may_enter(turn, final_state)
    if turn.retry_of is not None:
        await replace_retried_answer(db, retry_of=turn.retry_of, answer=message.id)
    events: list[tuple[EventType, BaseModel]] = []
    if retracted:
        retraction = RetractedData(message_id=message.id, replacement_text=message.text)
        events.append((EventType.retracted, retraction))
    events += [
        state_event(final_state),
        (EventType.done, MessageData(message=MessageView.from_row(message))),
    ]
    # The session released, and the state and the answer written with their events: one
    # statement.
    read = await close_out_announced(
        db,
        session_id=turn.session_id,
        turn_id=turn.id,
        reason=DeclineReason.turn_ended,
        events=events,
        moving_to=final_state,
        answer=message.id,
        backlog=backlog,
        steered_through=steered_through,
    )
    return Completed(message, read)


@dataclass(frozen=True)
class Completed:
    """What `complete_turn` stored: the message the turn ends with, and the session's backlog
    when it was asked for and read with the ending (None: the summary's check reads it)."""

    message: MessageRow
    backlog: Backlog | None = None


async def streamed_so_far(db: Db, *, turn_id: str) -> tuple[str | None, str]:
    """The message the user last saw streaming in this turn and its text, exactly as a client
    applying deltas and resets in order shows it. The event log is the record of that."""
    message_id: str | None = None
    text = ""
    for event in await db.rows(_STREAMED, {"turn_id": turn_id}, _Streamed):
        data = event.data
        if event.type == EventType.delta:
            if data["message_id"] != message_id:
                message_id, text = data["message_id"], ""
            text += data["text"]
        elif data["message_id"] == message_id:
            text = ""
    return message_id, text


@dataclass(frozen=True)
class _Streamed:
    type: str
    data: dict[str, Any]


_STREAMED = f"""
    SELECT type, data FROM turn_events
    WHERE turn_id = %(turn_id)s AND type IN ('{EventType.delta.value}', '{EventType.reset.value}')
    ORDER BY id
"""


async def end_unfinished_turn(
    db: Db,
    *,
    turn_id: str,
    state: TurnState,
    error: ErrorData | None = None,
) -> None:
    """End a turn that did not finish: `cancelled` (by the user or abandoned) or `failed`.

    What had streamed is kept, marked `cancelled` or `incomplete`, so a retry can replace it.
    A cancelled turn always ends with a message (the `cancelled` event carries one); a failed
    turn that showed nothing ends with the `error` event alone. Idempotent.
    """
    turn = await _lock(db, turn_id)
    if turn.state in TERMINAL_TURN_STATES:
        return
    if turn.cancel_requested_at is not None:
        # The user's Stop came first: the turn ends the way they asked, whatever else failed.
        state, error = TurnState.cancelled, None
    may_enter(turn, state)  # moved by the ending's announcement, below
    await _answer_open_calls(db, turn_id=turn_id, state=state)
    message = await _keep_streamed(db, turn, state)
    await close_out(db, session_id=turn.session_id, turn_id=turn.id, reason=state.value)
    if error is not None:
        await db.run(_ERROR, {"turn_id": turn_id, "error": Jsonb(error.model_dump(mode="json"))})
    events: list[tuple[EventType, BaseModel]] = [state_event(state)]
    if state == TurnState.cancelled:
        assert message is not None
        events.append((EventType.cancelled, MessageData(message=MessageView.from_row(message))))
    else:
        assert error is not None, "a failed turn ends with its error"
        events.append((EventType.error, error))
    # The move sets what streamed as the turn's answer, when it was kept.
    answer = message.id if message is not None else None
    await append_events(db, turn_id=turn_id, events=events, moving_to=state, answer=answer)


_ERROR = "UPDATE turns SET error = %(error)s WHERE id = %(turn_id)s"


async def _answer_open_calls(conn: Db, *, turn_id: str, state: TurnState) -> None:
    """Tool calls the turn never got to answer get a result now: a transcript with a call and
    no result is refused by real providers, and would break every later turn."""
    params = {"turn_id": turn_id, "pending": ToolCallStatus.pending.value}
    result = {
        "error": {
            "code": state.value,
            "message": f"the turn was {state.value} before this ran",
            "retryable": True,
        }
    }
    for open_call in await conn.rows(_OPEN_CALLS, params, ToolCallRow):
        await store_tool_result(conn, call=open_call, status=ToolCallStatus.error, result=result)


_OPEN_CALLS = f"""
    SELECT {ToolCallRow.COLUMNS} FROM tool_calls
    WHERE turn_id = %(turn_id)s AND status = %(pending)s
    ORDER BY created_at
"""


async def _keep_streamed(conn: Db, turn: TurnFacts, state: TurnState) -> MessageRow | None:
    """Store what streamed as the turn's answer, marked `cancelled` or `incomplete` (the
    caller's move makes it the turn's answer)."""
    streamed_id, text = await streamed_so_far(conn, turn_id=turn.id)
    if not text and state != TurnState.cancelled:
        return None
    candidate = unfinished_message_id(turn_id=turn.id, streamed_message_id=streamed_id)
    if await conn.value(_MESSAGE_STORED, {"id": candidate}) is not None:
        candidate = unfinished_message_fallback_id(candidate=candidate)
    cancelled = state == TurnState.cancelled
    return await append_message(
        conn,
        session_id=turn.session_id,
        turn_id=turn.id,
        message_id=candidate,
        role="assistant",
        text=text,
        status=MessageStatus.cancelled if cancelled else MessageStatus.incomplete,
    )


_MESSAGE_STORED = "SELECT 1 FROM messages WHERE id = %(id)s"


async def fail_turn(db: Db, *, turn_id: str, code: str, message: str, retryable: bool) -> None:
    """Mark the turn failed, keep what streamed as `incomplete`, end with `error`."""
    await end_unfinished_turn(
        db,
        turn_id=turn_id,
        state=TurnState.failed,
        error=ErrorData(code=code, message=message, retryable=retryable),
    )
