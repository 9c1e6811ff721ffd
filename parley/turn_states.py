"""The turn's state machine: which state may follow which. Pure, so it is tested alone.

`store.turns.move_turn` is the one function that changes a stored turn's state, and it asks
`can_move` first. The workflow's search attribute only mirrors the state for operators.

    queued ─► received (the session's running turn ended; dropped: cancelled)
    received ─► building_context ─► calling_model ─► executing_tools ─► calling_model …
    calling_model ─► awaiting_confirmation ─► executing_action ─► calling_model …
    awaiting_confirmation ─► calling_model (declined: the model words it)
    executing_tools ─► awaiting_input ─► executing_tools (a specialist asked and was answered)
    executing_tools ─► awaiting_confirmation ─► executing_tools (a specialist's proposal)
    any state that is not terminal ─► completed | failed | cancelled | expired

A retry does not move a finished turn: it opens a new turn row in `received`.
"""

from __future__ import annotations

from parley.contracts import TERMINAL_TURN_STATES, TurnState

_ENDINGS = TERMINAL_TURN_STATES

ALLOWED: dict[TurnState, frozenset[TurnState]] = {
    TurnState.queued: frozenset({TurnState.received}) | _ENDINGS,
    TurnState.received: frozenset({TurnState.building_context}) | _ENDINGS,
    TurnState.building_context: frozenset({TurnState.calling_model}) | _ENDINGS,
    TurnState.calling_model: frozenset({TurnState.executing_tools, TurnState.awaiting_confirmation})
    | _ENDINGS,
    # The next model call follows the tool results (its context is built without a move); a
    # specialist run by a tool call may ask the user, or propose an action.
    TurnState.executing_tools: frozenset(
        {TurnState.calling_model, TurnState.awaiting_input, TurnState.awaiting_confirmation}
    )
    | _ENDINGS,
    # Confirmed: the action runs; declined: the model (or the specialist) words it.
    TurnState.awaiting_confirmation: frozenset(
        {TurnState.executing_action, TurnState.calling_model, TurnState.executing_tools}
    )
    | _ENDINGS,
    # The specialist was answered and works on.
    TurnState.awaiting_input: frozenset({TurnState.executing_tools}) | _ENDINGS,
    TurnState.executing_action: frozenset({TurnState.calling_model, TurnState.executing_tools})
    | _ENDINGS,
    # Terminal: nothing follows.
    TurnState.completed: frozenset(),
    TurnState.failed: frozenset(),
    TurnState.cancelled: frozenset(),
    TurnState.expired: frozenset(),
}


class IllegalTransition(Exception):
    """A move the table does not allow; a bug or a race, never a client's mistake."""

    def __init__(self, *, turn_id: str, from_state: TurnState, to: TurnState) -> None:
        super().__init__(f"turn {turn_id} cannot move from {from_state} to {to}")
        self.turn_id = turn_id
        self.from_state = from_state
        self.to = to


def can_move(from_state: TurnState, to: TurnState) -> bool:
    return to in ALLOWED[TurnState(from_state)]
