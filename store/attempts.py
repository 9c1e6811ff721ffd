"""A model call's attempt opened in one statement, in autocommit: the turn locked and checked,
the step entered (its `state` event appended, the doorbell rung) and the attempt counted.

The opening used to be a transaction of four round trips (the turn locked with its call, the
state's append, the attempt's count, the commit). Each part here is conditional on what the
same statement found, so nothing is written for a call that an earlier attempt finished, for
a turn that ended or whose Stop is recorded, or for a move the table of states refuses; the
caller tells those apart from the row it gets back. A paused tenant's turn enters the step
(the stream shows it) but its attempt is not counted: no model is called.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from parley.contracts import TurnState
from parley.turn_states import can_move
from store.db import Conn
from store.events import NOTIFY_CHANNEL, event_batch, state_event
from store.steps import CALL_COLUMNS, CallRow, ForAttempt
from store.turn_rows import TurnRow


@dataclass(frozen=True)
class Opened:
    """What an attempt's opening found (`found`: the turn as it was before the move, the
    call as it now stands) and whether it counted the attempt (and so entered the step)."""

    found: ForAttempt
    counted: bool


async def open_attempt(conn: Conn, *, turn_id: str, model_call_id: str, to: TurnState) -> Opened:
    """Open an attempt at the turn's model call as step `to` (see the module's docstring):
    one round trip, on a `Conn` in autocommit (the statement commits by itself).
    LookupError for an unknown turn."""
    wire, batch = event_batch(*state_event(to))
    params = {
        "turn": turn_id,
        "call": model_call_id,
        "to": to.value,
        "movable": [s.value for s in TurnState if can_move(s, to)],
        "event": wire,
        "batch": batch,
    }
    opened = await conn.made(_OPEN_ATTEMPT, params, _opened)
    if opened is None:
        raise LookupError(turn_id)
    return opened


def _opened(
    *, paused: bool | None, runs: bool, counted: int | None, notified: Any, **columns: Any
) -> Opened:
    turn = TurnRow.from_columns(columns)
    call = {k: v for k, v in columns.items() if not k.startswith("t_")}
    if call["id"] is None:
        return Opened(ForAttempt(turn, None, bool(paused)), counted=False)
    if counted is not None:
        call["attempts"] = counted
    return Opened(ForAttempt(turn, CallRow(**call), bool(paused)), counted=counted is not None)


# `found` reads the turn locked (in READ COMMITTED, the newest version of its row) with its call
# and tenant, and decides whether the step runs; the writes below it are conditional on that.
# The move to `to` and its `state` event are what `store.events` appends for a move; the state
# event is the only one, so its id is the turn's new `last_event_id`.
_OPEN_ATTEMPT = f"""
    WITH t AS (
        SELECT id, session_id, tenant_id, state, cancel_requested_at, assistant_message_id,
            retry_of
        FROM turns WHERE id = %(turn)s
        FOR UPDATE
    ), found AS (
        SELECT {TurnRow.COLUMNS}, {CALL_COLUMNS}, n.paused,
            c.id IS NOT NULL AND c.finish_reason IS NULL AND t.cancel_requested_at IS NULL
                AND (t.state = %(to)s OR t.state = ANY(%(movable)s)) AS runs
        FROM t
        LEFT JOIN model_calls AS c ON c.id = %(call)s
        LEFT JOIN tenants AS n ON n.id = t.tenant_id
    ), moved AS (
        UPDATE turns SET state = %(to)s, last_event_id = turns.last_event_id + 1,
            updated_at = now()
        FROM found
        WHERE turns.id = found.t_id AND found.runs AND found.t_state <> %(to)s
        RETURNING turns.last_event_id AS event_id
    ), announced AS (
        INSERT INTO turn_events (turn_id, id, type, data, created_at)
        SELECT %(turn)s, moved.event_id, 'state', CAST(%(event)s AS jsonb), now() FROM moved
        RETURNING id
    ), counted AS (
        UPDATE model_calls SET attempts = model_calls.attempts + 1
        FROM found
        WHERE model_calls.id = found.id AND found.runs AND found.paused IS NOT TRUE
        RETURNING model_calls.attempts
    )
    SELECT found.*, (SELECT attempts FROM counted) AS counted, (
        SELECT pg_notify('{NOTIFY_CHANNEL}', %(turn)s || ':' || announced.id::text || ':'
            || %(batch)s)
        FROM announced
    ) AS notified
    FROM found
"""
