"""The statements a tool call's step makes (store/steps.py, store/turns/tool_calls.py,
store/turns/), against a turn in which the shared stack has just looked up Priya's orders.
Writes happen in transactions that are rolled back, so the turn stays as the stack left it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
import pytest_asyncio
from sqlalchemy import text

from parley.contracts import EventType, TurnState
from parley.ids import tool_result_message_id
from parley.resolver import ACTIVE_ORDER, Slot
from parley.statuses import ToolCallStatus
from parley.store import slots, steps, turns
from parley.store.db import Database, Db, connect
from parley.store.turns.tool_calls import ToolCallRow, store_tool_result
from parley.wire import ToolData
from tests.support.client import ParleyClient
from tests.support.orm import orm

# Priya's lookup made 8472 the conversation's active order; these calls find another.
FOUND = {"order_id": "8390", "status": "delivered"}


@pytest_asyncio.fixture
async def looked_up(priya: ParleyClient, sessions: Database) -> tuple[str, str]:
    """A turn of Priya's whose model asked for one tool, ended `done`: its id and the call's."""
    session_id = await priya.new_session()
    turn_id, seen = await priya.turn(session_id, "Where is my order?")
    assert seen[-1].type == "done"
    async with orm(sessions) as db:
        call_id = await db.scalar(
            text("SELECT id FROM tool_calls WHERE turn_id = :turn_id"), {"turn_id": turn_id}
        )
    assert call_id is not None
    return turn_id, call_id


async def _pending_call(db: Db, stored: ToolCallRow, suffix: str) -> ToolCallRow:
    """Another call of the stored one's model call, not yet run (in the caller's transaction)."""
    await db.run(
        "INSERT INTO tool_calls (id, turn_id, model_call_id, provider_call_id, name,"
        " arguments, args_hash, status, attempts)"
        " VALUES (%(id)s, %(turn_id)s, %(model_call_id)s, %(provider)s, 'get_order',"
        " CAST(%(arguments)s AS jsonb), 'h', 'pending', 0)",
        {
            "id": f"{stored.id}-{suffix}",
            "turn_id": stored.turn_id,
            "model_call_id": stored.model_call_id,
            "provider": f"call-{suffix}",
            "arguments": '{"order_id": "8390"}',
        },
    )
    call = await steps.get_tool_call(db, call_id=f"{stored.id}-{suffix}")
    assert call is not None and call.status == ToolCallStatus.pending
    return call


@dataclass(frozen=True)
class ToolMessage:
    seq: int
    role: str
    tool_call_id: str | None
    text: str


async def _tool_messages(db: Db, call: ToolCallRow) -> list[ToolMessage]:
    return await db.rows(
        "SELECT seq, role, tool_call_id, text FROM messages WHERE id = %(id)s",
        {"id": tool_result_message_id(tool_call_id=call.id)},
        ToolMessage,
    )


async def _last_seq(db: Db, turn_id: str) -> int:
    found = await db.value(
        "SELECT s.last_seq FROM sessions s JOIN turns t ON t.session_id = s.id WHERE t.id = %(t)s",
        {"t": turn_id},
    )
    return int(found)


@dataclass(frozen=True)
class Event:
    id: int
    type: str
    data: dict[str, Any]


async def test_a_calls_reads_find_it_with_its_turn_and_tenant(
    sessions: Database, looked_up: tuple[str, str]
) -> None:
    turn_id, call_id = looked_up
    async with connect(sessions) as conn:
        call = await steps.get_tool_call(conn, call_id=call_id)
        assert call is not None
        assert (call.turn_id, call.name, call.status) == (turn_id, "list_open_orders", "ok")
        assert call.attempts == 1 and call.completed_at is not None
        assert call.result is not None and call.result["orders"]
        assert await steps.get_tool_call(conn, call_id="call-that-is-not") is None
        async with conn.transaction():
            found = await steps.lock_for_tool_call(conn, turn_id=turn_id, call_id=call_id)
        assert found.call == call
        assert (found.turn.id, found.turn.tenant_id, found.turn.user_id) == (
            turn_id,
            "northwind",
            "cust_2291",
        )
        assert found.turn.state == TurnState.completed
        assert found.tenant.offered("list_open_orders")
        with pytest.raises(LookupError):  # a call is found only with its own turn
            await steps.lock_for_tool_call(conn, turn_id="turn-that-is-not", call_id=call_id)
    async with sessions() as db:  # in a session's transaction, the same row
        assert await steps.get_tool_call(db, call_id=call_id) == call


async def test_a_calls_outcome_is_stored_once_with_its_message_and_referent(
    sessions: Database, looked_up: tuple[str, str]
) -> None:
    turn_id, call_id = looked_up
    async with sessions() as db:
        stored = await steps.get_tool_call(db, call_id=call_id)
        assert stored is not None
        call = await _pending_call(db, stored, "a")
        seq = await _last_seq(db, turn_id)
        referent = (ACTIVE_ORDER, Slot("8390", "tool:get_order", 7))
        first = await store_tool_result(
            db, call=call, status=ToolCallStatus.ok, result=FOUND, attempts=2, referent=referent
        )
        assert first is not None
        assert (first.status, first.result, first.attempts) == ("ok", FOUND, 2)
        assert first.completed_at is not None
        [message] = await _tool_messages(db, call)
        assert (message.seq, message.role, message.tool_call_id) == (seq + 1, "tool", "call-a")
        assert "8390" in message.text
        session_id = await db.value("SELECT session_id FROM turns WHERE id = %(t)s", {"t": turn_id})
        active = (await slots.get_slots(db, session_id=session_id))[ACTIVE_ORDER]
        assert (active.value, active.source, active.set_at_seq) == ("8390", "tool:get_order", 7)

        # A later attempt finds the outcome stored: it stores nothing, and the first stands.
        again = await store_tool_result(
            db, call=call, status=ToolCallStatus.error, result={"error": {"code": "x"}}
        )
        assert again is None
        assert await steps.get_tool_call(db, call_id=call.id) == first
        assert len(await _tool_messages(db, call)) == 1
        assert await _last_seq(db, turn_id) == seq + 1

        # The same order found again leaves the slot's provenance as it was.
        other = await _pending_call(db, stored, "b")
        same = (ACTIVE_ORDER, Slot("8390", "tool:check_return_eligibility", 9))
        await store_tool_result(
            db, call=other, status=ToolCallStatus.ok, result=FOUND, referent=same
        )
        active = (await slots.get_slots(db, session_id=session_id))[ACTIVE_ORDER]
        assert (active.source, active.set_at_seq) == ("tool:get_order", 7)
        await db.rollback()


async def test_a_turn_that_ends_with_a_call_unanswered_answers_it(
    sessions: Database, looked_up: tuple[str, str]
) -> None:
    """A transcript with a call and no result is refused by real providers: the ending
    answers every open call."""
    turn_id, call_id = looked_up
    async with sessions() as db:
        stored = await steps.get_tool_call(db, call_id=call_id)
        assert stored is not None
        await db.run("UPDATE turns SET state = 'executing_tools' WHERE id = %(t)s", {"t": turn_id})
        call = await _pending_call(db, stored, "open")
        await turns.end_unfinished_turn(db, turn_id=turn_id, state=TurnState.cancelled)
        answered = await steps.get_tool_call(db, call_id=call.id)
        assert answered is not None and answered.status == ToolCallStatus.error
        assert answered.result is not None and answered.result["error"]["code"] == "cancelled"
        assert len(await _tool_messages(db, call)) == 1
        await db.rollback()


async def test_a_step_enters_its_state_and_shows_its_events_in_one_append(
    sessions: Database, looked_up: tuple[str, str]
) -> None:
    turn_id, call_id = looked_up
    async with sessions() as db:
        await db.run("UPDATE turns SET state = 'calling_model' WHERE id = %(t)s", {"t": turn_id})
        before = await db.value("SELECT last_event_id FROM turns WHERE id = %(t)s", {"t": turn_id})
        entered = await turns.advance_turn(db, turn_id=turn_id, to=TurnState.executing_tools)
        assert (entered.id, entered.state) == (turn_id, TurnState.executing_tools)
        # A repeat changes nothing; its events are still shown.
        start = ToolData(call_id="c", name="get_order", phase="start", label="Looking it up")
        again = await steps.lock_for_tool_call(db, turn_id=turn_id, call_id=call_id)
        await turns.advance_locked(
            db, again.turn, to=TurnState.executing_tools, then=[(EventType.tool, start)]
        )
        shown = await db.rows(
            "SELECT id, type, data FROM turn_events WHERE turn_id = %(t)s AND id > %(after)s",
            {"t": turn_id, "after": before},
            Event,
        )
        assert [(e.type, e.data.get("state")) for e in shown] == [
            ("state", "executing_tools"),
            ("tool", None),
        ]
        await db.run(
            "UPDATE turns SET cancel_requested_at = now() WHERE id = %(t)s", {"t": turn_id}
        )
        with pytest.raises(turns.TurnStopped):
            await turns.advance_turn(db, turn_id=turn_id, to=TurnState.calling_model)
        await db.rollback()
