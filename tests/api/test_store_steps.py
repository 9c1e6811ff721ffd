"""The named statements a turn's steps call (store/steps.py, store/events.py), each against a
turn the shared stack has just answered. Writes happen in transactions that are rolled back,
so the turn stays as the stack left it."""

from __future__ import annotations

import pytest
import pytest_asyncio

from parley.contracts import EventType, TurnState
from parley.ids import message_id_for_call
from parley.store import events, steps, traces
from parley.store.db import Database, connect
from parley.store.event_log import read_log
from parley.store.turns.reads import turn_facts
from parley.wire import FollowupsData, WarningData
from tests.support.client import ParleyClient
from tests.support.toolkit import counted_sessions

QUESTION = "What can you help me with today?"
LAST_EVENT_ID = "SELECT last_event_id FROM turns WHERE id = %(id)s"


@pytest_asyncio.fixture
async def answered(priya: ParleyClient) -> str:
    """A plain turn of Priya's, ended `done`."""
    session_id = await priya.new_session()
    turn_id, seen = await priya.turn(session_id, QUESTION)
    assert seen[-1].type == "done"
    return turn_id


async def test_a_steps_reads_find_the_turns_question_call_and_answer(
    sessions: Database, answered: str
) -> None:
    owners = await traces.turn_owners(sessions, answered)
    assert owners is not None and owners.tenant_id
    assert await traces.turn_owners(sessions, "turn-that-is-not") is None
    async with sessions() as db:
        call = await steps.step_call(db, turn_id=answered, step=0)
        assert call is not None and call.finish_reason is not None
        assert await steps.get_call(db, model_call_id=call.id) == call
        assert await steps.get_call(db, model_call_id="mc-that-is-not") is None
        assert await steps.step_call(db, turn_id=answered, step=7) is None
        assert await steps.question(db, turn_id=answered) == QUESTION
        texts = await steps.response_texts(db, turn_id=answered)
        assert texts and texts[0] == call.response_text
        tools = await steps.first_step_tools(db, turn_id=answered)
        assert isinstance(tools, list)
    async with connect(sessions) as db:
        last = await steps.last_stream_event(
            db, turn_id=answered, message_id=message_id_for_call(call.id)
        )
        assert last == EventType.delta
        assert await steps.last_stream_event(db, turn_id=answered, message_id="nope") is None
    async with sessions() as db:
        assert await steps.question(db, turn_id="turn-that-is-not") is None


async def test_a_stored_call_reads_back_as_written_with_the_resolution_it_carried(
    sessions: Database, answered: str
) -> None:
    resolution = {"kind": "order", "order_id": "A-17"}
    async with sessions() as db:
        written = await steps.insert_call(
            db,
            turn_id=answered,
            step=5,
            provider="resolver",
            model="reference-resolver",
            request={"resolution": resolution},
            response_text="Which order?",
            finish_reason="clarification",
            resolution=resolution,
        )
        assert (written.step, written.attempts, written.response_text) == (5, 0, "Which order?")
        assert await steps.step_call(db, turn_id=answered, step=5) == written
        turn = await turn_facts(db, turn_id=answered)
        assert turn is not None
        assert turn.resolution == resolution
        plain = await steps.insert_call(
            db, turn_id=answered, step=6, provider="demo", model="demo", request={}
        )
        assert plain.finish_reason is None and plain.id != written.id
        await db.rollback()


async def test_the_locking_reads_return_the_turn_with_its_call(
    sessions: Database, answered: str
) -> None:
    async with sessions() as db:
        call = await steps.step_call(db, turn_id=answered, step=0)
        assert call is not None
        attempt = await steps.lock_for_attempt(db, turn_id=answered, model_call_id=call.id)
        turn = attempt.turn
        assert (turn.id, turn.state, attempt.paused) == (answered, TurnState.completed, False)
        assert attempt.call is not None
        assert (attempt.call.id, attempt.call.response_text) == (call.id, call.response_text)
        turn, found = await steps.lock_with_call(db, turn_id=answered, model_call_id=call.id)
        assert (turn.id, found.id, found.finish_reason) == (answered, call.id, call.finish_reason)
        facts = await steps.answer_facts(db, turn_id=answered)
        # The turn has ended; its one call's answer is the text the output screen reads.
        assert facts == steps.AnswerFacts(False, [], QUESTION, [call.response_text])
        call_id = call.id
        await db.rollback()
        with pytest.raises(LookupError):
            await steps.lock_for_attempt(db, turn_id="turn-that-is-not", model_call_id=call_id)


async def test_a_warning_is_appended_once_per_code(database_url: str, answered: str) -> None:
    """`warn_once` looks for the code and appends in one statement: a second warning of the
    code is not appended (the stream says it once), one of another code is, after it. (On an
    engine of its own: the shared worker's statements on the shared one are not this test's.)"""
    trimmed = WarningData(code="context_trimmed", message="left out: nothing")
    again = WarningData(code="context_trimmed", message="left out: more")
    other = WarningData(code="mcp_unavailable", message="no MCP tools")
    async with counted_sessions(database_url) as (sessions, sent):
        async with sessions() as db:
            last = (await read_log(db, turn_id=answered, after=0)).events[-1].id
            sent.clear()
            assert await events.warn_once(db, turn_id=answered, data=trimmed)
            assert len(sent) == 1  # the look and the append: one statement
            assert not await events.warn_once(db, turn_id=answered, data=again)
            assert await events.warn_once(db, turn_id=answered, data=other)
            assert not await events.warn_once(db, turn_id="turn-that-is-not", data=trimmed)
            logged = (await read_log(db, turn_id=answered, after=last)).events
            assert [(e.id, e.type, e.data["code"]) for e in logged] == [
                (last + 1, "warning", "context_trimmed"),
                (last + 2, "warning", "mcp_unavailable"),
            ]
            await db.rollback()


async def test_an_append_moves_the_turn_only_when_asked_to(
    sessions: Database, answered: str
) -> None:
    """The event log's two append statements: one takes ids, the other takes ids and sets the
    turn's state in the same UPDATE."""
    data = WarningData(code="tool_unavailable", message="probe")
    async with sessions() as db:
        turn = await turn_facts(db, turn_id=answered)
        assert turn is not None
        state, last = turn.state, await db.value(LAST_EVENT_ID, {"id": answered})
        first = await events.append_events(db, turn_id=answered, events=[(EventType.warning, data)])
        turn = await turn_facts(db, turn_id=answered)
        assert turn is not None
        now_last = await db.value(LAST_EVENT_ID, {"id": answered})
        assert (first, turn.state, now_last) == ([last + 1], state, last + 1)
        moved = await events.append_events(
            db,
            turn_id=answered,
            events=[(EventType.warning, data), (EventType.warning, data)],
            moving_to=TurnState.failed,
        )
        turn = await turn_facts(db, turn_id=answered)
        assert turn is not None
        assert (moved, turn.state) == ([last + 2, last + 3], TurnState.failed)
        await db.rollback()


async def test_follow_ups_are_appended_only_while_the_turn_is_open(
    sessions: Database, answered: str
) -> None:
    """The suggestions' append (store/events.py `append_while_open`) writes nothing to a turn
    that has ended: no event, no id taken, no doorbell."""
    data = FollowupsData(suggestions=["Track my order"])
    async with connect(sessions) as conn:
        last = await conn.value(LAST_EVENT_ID, {"id": answered})
        assert not await events.append_while_open(
            conn, turn_id=answered, type=EventType.followups, data=data
        )
        assert await conn.value(LAST_EVENT_ID, {"id": answered}) == last


async def test_a_batch_of_spans_keeps_the_turns_and_leaves_out_what_no_turn_asked(
    sessions: Database, answered: str
) -> None:
    """A summary pass after an import names the import as what asked for it: its span has no
    turn to belong to, and the turn's own span in the same batch is still recorded."""
    span = {"name": "summarize", "attempt": 1, "outcome": "ok", "attrs": {}}
    when = {"started_at": "2026-12-06T00:00:00Z", "ended_at": "2026-12-06T00:00:01Z"}
    await traces.insert_spans(
        sessions,
        [{**span, **when, "turn_id": "imp_not_a_turn"}, {**span, **when, "turn_id": answered}],
    )
    async with connect(sessions) as conn:
        names = await conn.value(
            "SELECT array_agg(turn_id) FROM trace_spans "
            "WHERE name = 'summarize' AND turn_id = ANY(%(ids)s)",
            {"ids": ["imp_not_a_turn", answered]},
        )
    assert names == [answered]
