"""A stored turn's state: the one UPDATE that moves it, the one INSERT that gives a turn its
first state, and the check of a move against the table of allowed moves
(`parley.turn_states`, whose persistence this is).

No statement here runs by itself. A move is always announced on the stream by its `state`
event, in the UPDATE that takes that event's id from the turn's counter, so `MOVE` opens the
`counter` of an append (store/events.py `counter`) and a birth's `BORN` sets the counter to
its first events. The paths that compose them, each keeping its one round trip:

- store/events.py `append_events(moving_to=...)`: `store.turns` (`move_turn`, the steps'
  `advance_*`, the confirmation card, an unfinished ending) and `store.queue` (a promotion,
  a drop);
- store/turns/endings.py `close_out_announced`: a finished turn's ending with its release;
- store/turns/attempts.py `open_attempt`: a model call's step entered with its attempt counted;
- store/context.py `read_for_build`: the build's rows read with its move;
- store/turns/birth.py: a plain post's turn born with its message;
- store/turns/birth.py `open_turn` (a retry's turn) and store/queue.py `queue_message` (a queued
  turn), each born with its first event.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Protocol

from parley.contracts import TurnState
from parley.turn_states import IllegalTransition, can_move


class Moving(Protocol):
    """A turn's row of any kind (`TurnRow`, `TurnFacts`, or the session's own `Turn`)."""

    @property
    def id(self) -> str: ...
    @property
    def state(self) -> str: ...
    @property
    def cancel_requested_at(self) -> datetime | None: ...


def may_enter(turn: Moving, to: TurnState) -> bool:
    """Whether the turn (its row locked, or read by the statement that moves it) moves to
    `to`: False for a repeat of its state (a retried step enters it again),
    `IllegalTransition` for a move the table does not allow."""
    if turn.state == to:
        return False
    if not can_move(TurnState(turn.state), to):
        raise IllegalTransition(turn_id=turn.id, from_state=TurnState(turn.state), to=to)
    return True


def move_params(to: TurnState, *, answer: str | None = None) -> dict[str, Any]:
    """`MOVE`'s parameters: the state entered, the states the table lets a turn come from
    into it (for a statement that guards its move in SQL: `turns.state = ANY(%(from)s)`),
    and the turn's answer (None keeps it)."""
    return {
        "to": to.value,
        "from": [state.value for state in TurnState if can_move(state, to)],
        "answer": answer,
    }


# The start of the UPDATE that moves a turn (parameters `move_params`); the composer goes on
# with the rest of its SET list (the event counter's), its WHERE and its RETURNING. Columns
# are qualified: a composer may join the turn to other rows (`UPDATE ... FROM`).
MOVE = (
    "UPDATE turns SET state = %(to)s,"
    " assistant_message_id = COALESCE(%(answer)s, turns.assistant_message_id)"
)

# A turn born in `to` with its first `n` events counted (the composer inserts them: it names
# this INSERT its append's `counter`), for a user message already stored, on the session's
# active branch (store/branches.py).
BORN = """INSERT INTO turns (id, session_id, tenant_id, user_id, user_message_id, user_seq,
            state, last_event_id, viewers, branch)
        VALUES (%(turn_id)s, %(session_id)s, %(tenant_id)s, %(user_id)s, %(message_id)s,
            %(seq)s, %(to)s, %(n)s, 0,
            (SELECT branch FROM sessions WHERE id = CAST(%(session_id)s AS varchar)))"""
