"""A model call's attempt in one statement each (store/turns/attempts.py) against the real database:
the opening enters the step and counts the attempt only when the turn may take it, and a reply
that asks for tools is stored whole, once."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

import pytest

from parley.contracts import TurnState
from parley.costs import Usage, call_cost
from parley.ids import message_id_for_call, tool_call_row_id
from parley.store import costs, steps, turns
from parley.store.db import Database, Db, connect
from parley.store.identity import Identity
from parley.store.steps import CallRow
from parley.store.turns import attempts
from parley.turn_states import IllegalTransition
from tests.support.toolkit import post_unstarted

Sessions = Database
PRIYA = Identity(tenant_id="northwind", user_id="cust_2291", roles=())
EVENTS = (
    "SELECT type, data ->> 'state' AS state FROM turn_events WHERE turn_id = %(id)s ORDER BY id"
)
TOOL_CALLS = "SELECT count(*) FROM tool_calls WHERE model_call_id = %(id)s AND status = 'pending'"
MESSAGE_SEQ = "SELECT seq FROM messages WHERE id = %(id)s"


async def _turn_with_call(sessions: Sessions) -> tuple[str, CallRow]:
    """A turn of Priya's that no workflow runs, still in `received`, with a model call."""
    async with sessions() as db:
        posted = await post_unstarted(db, owner=PRIYA, text="Where is my order?")
    async with connect(sessions) as conn:
        call = await steps.insert_call(
            conn, turn_id=posted.turn.id, step=0, provider="demo", model="demo", request={}
        )
    return posted.turn.id, call


async def _open(conn: Db, turn_id: str, call: CallRow) -> attempts.Opened:
    return await attempts.open_attempt(
        conn, turn_id=turn_id, model_call_id=call.id, to=TurnState.calling_model
    )


async def _states(conn: Db, turn_id: str) -> list[str]:
    rows = await conn.rows(EVENTS, {"id": turn_id}, _Event)
    return [r.state for r in rows if r.type == "state"]


@dataclass(frozen=True)
class _Event:
    type: str
    state: str | None


async def test_an_opening_counts_an_attempt_only_where_the_turn_may_take_it(
    sessions: Sessions,
) -> None:
    turn_id, call = await _turn_with_call(sessions)
    async with connect(sessions) as conn:
        # `received` may not move to `calling_model`: nothing is written.
        refused = await _open(conn, turn_id, call)
        assert not refused.counted and refused.found.turn.state == TurnState.received
        with pytest.raises(IllegalTransition):
            turns.may_move(refused.found.turn, to=TurnState.calling_model)
        assert await _states(conn, turn_id) == ["received"]  # the post's own
        await turns.advance_turn(conn, turn_id=turn_id, to=TurnState.building_context)

        first = await _open(conn, turn_id, call)
        assert first.counted and first.found.call is not None
        assert first.found.call.attempts == 1
        second = await _open(conn, turn_id, call)  # a retry: counted, the step not entered again
        assert second.counted and second.found.call is not None
        assert second.found.call.attempts == 2
        assert second.found.turn.state == TurnState.calling_model
        assert await _states(conn, turn_id) == ["received", "building_context", "calling_model"]

    async with sessions() as db:
        await turns.request_cancel(db, turn_id=turn_id)
        await db.commit()
    async with connect(sessions) as conn:
        stopped = await _open(conn, turn_id, call)
        assert not stopped.counted and stopped.found.call is not None
        assert stopped.found.call.attempts == 2
        with pytest.raises(turns.TurnStopped):
            turns.may_move(stopped.found.turn, to=TurnState.calling_model)
        with pytest.raises(LookupError):
            await attempts.open_attempt(
                conn, turn_id="turn-that-is-not", model_call_id=call.id, to=TurnState.calling_model
            )


async def test_a_reply_that_asks_for_tools_is_stored_whole_and_once(sessions: Sessions) -> None:
    turn_id, call = await _turn_with_call(sessions)
    requested = [
        {"id": "p1", "name": "list_open_orders", "arguments": {}},
        {"id": "p2", "name": "get_order", "arguments": {"order_id": "8472"}},
    ]
    written = steps.answered(
        call,
        text="Let me look.",
        tool_calls=requested,
        finish_reason="tool_calls",
        usage={"output_tokens": 7},
        first_token_ms=3.0,
        total_ms=9.0,
    )
    entry = call_cost(
        provider="demo", model="demo-1", usage=Usage(40, 7), on=datetime.now(UTC).date()
    )
    bill = costs.ledger_params(
        key=costs.call_key(call.id), kind="turn", turn_id=turn_id, entry=entry
    )
    async with connect(sessions) as conn:
        assert await attempts.record_tool_requests(conn, written, bill=bill)
        seq = await conn.value(MESSAGE_SEQ, {"id": message_id_for_call(call.id)})
        # A retry adds nothing, and bills nothing again.
        assert not await attempts.record_tool_requests(conn, written, bill=bill)
        assert await costs.is_recorded(conn, key=costs.call_key(call.id))
        assert await steps.get_call(conn, model_call_id=call.id) == written
        assert await conn.value(MESSAGE_SEQ, {"id": message_id_for_call(call.id)}) == seq
        assert await conn.value(TOOL_CALLS, {"id": call.id}) == 2
        second = await steps.get_tool_call(
            conn, call_id=tool_call_row_id(model_call_id=call.id, position=1)
        )
        assert second is not None
        assert (second.provider_call_id, second.arguments) == ("p2", {"order_id": "8472"})
