"""A model call's attempt opened in one statement, in autocommit: the turn locked and checked,
the step entered (its `state` event appended, the doorbell rung) and the attempt counted. And
the outcome of an attempt whose reply asks for tools, in one statement too.

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

from psycopg.types.json import Jsonb

from parley.contracts import TurnState
from parley.ids import message_id_for_call, tool_call_row_id
from parley.statuses import ToolCallStatus
from parley.store.costs import LEDGER_ROW
from parley.store.db import Db
from parley.store.events import EVENTS_INSERTED, RUNG, append_params, counter, state_event
from parley.store.messages import MESSAGE_AT_SEQ, message_params, seq_taken
from parley.store.steps import (
    CALL_COLUMNS,
    OUTCOME_WRITTEN,
    OWNER_COLUMNS,
    CallRow,
    ForAttempt,
    outcome_params,
)
from parley.store.turns.reads import TURN_LOCKED, TurnRow
from parley.tools import args_hash


@dataclass(frozen=True)
class Opened:
    """What an attempt's opening found (`found`: the turn as it was before the move, the
    call as it now stands) and whether it counted the attempt (and so entered the step)."""

    found: ForAttempt
    counted: bool


async def open_attempt(conn: Db, *, turn_id: str, model_call_id: str, to: TurnState) -> Opened:
    """Open an attempt at the turn's model call as step `to` (see the module's docstring):
    one round trip, on a `Db` in autocommit (the statement commits by itself).
    LookupError for an unknown turn."""
    params = {**append_params(turn_id, [state_event(to)], moving_to=to), "call": model_call_id}
    opened = await conn.made(_OPEN_ATTEMPT, params, _opened)
    if opened is None:
        raise LookupError(turn_id)
    return opened


def _opened(
    *,
    paused: bool | None,
    prices: dict[str, Any] | None,
    budgets: dict[str, Any] | None,
    owner_tenant_id: str,
    owner_user_id: str,
    runs: bool,
    counted: int | None,
    notified: Any,
    **columns: Any,
) -> Opened:
    turn = TurnRow.from_columns(columns)
    call = {k: v for k, v in columns.items() if not k.startswith("t_")}
    owner = (owner_tenant_id, owner_user_id)
    if call["id"] is None:
        found = ForAttempt(turn, None, bool(paused), prices, budgets, owner)
        return Opened(found, counted=False)
    if counted is not None:
        call["attempts"] = counted
    found = ForAttempt(turn, CallRow(**call), bool(paused), prices, budgets, owner)
    return Opened(found, counted=counted is not None)


# `found` reads the turn locked (in READ COMMITTED, the newest version of its row) with its call
# and tenant, and decides whether the step runs; the writes below it are conditional on that.
# The move to `to` and its `state` event are `store.events`' append moving the turn, its
# counter guarded by `found`.
_MOVES_IF_IT_RUNS = (
    "FROM found WHERE turns.id = found.t_id AND found.runs AND found.t_state <> %(to)s"
)
_OPEN_ATTEMPT = f"""
    WITH t AS (
        SELECT id, session_id, tenant_id, user_id, state, cancel_requested_at,
            assistant_message_id, retry_of
        FROM turns WHERE id = %(turn_id)s
        FOR UPDATE
    ), found AS (
        SELECT {TurnRow.COLUMNS}, {CALL_COLUMNS}, n.paused, n.config -> 'prices' AS prices,
            n.config -> 'budgets' AS budgets, {OWNER_COLUMNS},
            c.id IS NOT NULL AND c.finish_reason IS NULL AND t.cancel_requested_at IS NULL
                AND (t.state = %(to)s OR t.state = ANY(%(from)s)) AS runs
        FROM t
        LEFT JOIN model_calls AS c ON c.id = %(call)s
        LEFT JOIN tenants AS n ON n.id = t.tenant_id
    ), {counter(moving=True, rest=_MOVES_IF_IT_RUNS)}, {EVENTS_INSERTED}, counted AS (
        UPDATE model_calls SET attempts = model_calls.attempts + 1
        FROM found
        WHERE model_calls.id = found.id AND found.runs AND found.paused IS NOT TRUE
        RETURNING model_calls.attempts
    )
    SELECT found.*, (SELECT attempts FROM counted) AS counted, {RUNG} AS notified
    FROM found
"""


async def record_tool_requests(conn: Db, written: CallRow, *, bill: dict[str, Any]) -> bool:
    """Write the outcome of a call whose reply asks for tools (`written`: the call as it is
    to be stored, `store.steps.answered`), with the model's tool-calling message and one
    `tool_calls` row per call, `pending`: one statement, so a retry after a crash finds all of
    it or none, and the stored calls always match their results. The turn's row is locked
    first, then the session's (its seq): the order of every writer of store/turns/. A retry
    that finds the message stored adds no other (nor any call it holds already). The call's
    ledger row (`bill`: `store.costs.ledger_params`) is written by the same statement;
    whether it wrote it."""
    requested = written.response_tool_calls or []
    calls = [
        {
            "id": tool_call_row_id(model_call_id=written.id, position=position),
            "provider_call_id": call["id"],
            "name": call["name"],
            "arguments": call["arguments"],
            "args_hash": args_hash(call["name"], call["arguments"]),
        }
        for position, call in enumerate(requested)
    ]
    message = message_params(
        message_id=message_id_for_call(written.id),
        turn_id=written.turn_id,
        role="assistant",
        text=written.response_text or "",
        tool_calls=requested,
    )
    params = {
        # The message's text and calls are the reply's as its outcome stores them (`text`,
        # `tool_calls`); its token count is taken as `message_params` takes it.
        **message,
        **outcome_params(written),
        "pending": ToolCallStatus.pending.value,
        "calls": Jsonb(calls),
        **bill,
    }
    found = await conn.rows(_RECORD_TOOL_REQUESTS, params, _Recorded)
    assert found, f"turn {written.turn_id} is missing"
    return found[0].billed > 0


@dataclass(frozen=True)
class _Recorded:
    session_id: str
    billed: int


_RECORD_TOOL_REQUESTS = f"""
    WITH {TURN_LOCKED}, outcome AS (
        {OUTCOME_WRITTEN}
        FROM turn
        WHERE model_calls.id = %(id)s
    ), {seq_taken(session="turn.session_id", message="%(message_id)s", joined="FROM turn")},
    message AS ({MESSAGE_AT_SEQ}), calls AS (
        INSERT INTO tool_calls
            (id, turn_id, model_call_id, provider_call_id, name, arguments, args_hash, status)
        SELECT c.id, %(turn_id)s, %(id)s, c.provider_call_id, c.name, c.arguments,
            c.args_hash, %(pending)s
        FROM turn, jsonb_to_recordset(%(calls)s) AS c(
            id text, provider_call_id text, name text, arguments jsonb, args_hash text
        )
        ON CONFLICT (id) DO NOTHING
    ), billed AS ({LEDGER_ROW})
    SELECT session_id, (SELECT count(*) FROM billed) AS billed FROM turn
"""
