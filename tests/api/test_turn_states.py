"""The turn's state machine: the table alone, then `move_turn` refusing against the store."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from sqlalchemy import select

from parley.contracts import TERMINAL_TURN_STATES, TurnState
from parley.store import actions, turns
from parley.store.db import Database, Db
from parley.store.identity import Identity
from parley.store.models import Action, Turn
from parley.turn_states import ALLOWED, IllegalTransition, can_move
from tests.support.orm import orm
from tests.support.toolkit import post_unstarted

PRIYA = Identity(tenant_id="northwind", user_id="cust_2291", roles=())


def test_the_table_names_every_state() -> None:
    assert set(ALLOWED) == set(TurnState)


@pytest.mark.parametrize("terminal", sorted(TERMINAL_TURN_STATES))
def test_a_terminal_state_has_no_exits(terminal: TurnState) -> None:
    assert ALLOWED[terminal] == frozenset()
    assert not any(can_move(terminal, to) for to in TurnState)


def test_every_state_is_reachable_from_where_a_turn_is_born() -> None:
    # A turn is born `received`, or `queued` behind its session's running turn.
    seen, frontier = {TurnState.queued}, [TurnState.queued]
    while frontier:
        for to in ALLOWED[frontier.pop()]:
            if to not in seen:
                seen.add(to)
                frontier.append(to)
    assert seen == set(TurnState)
    assert TurnState.queued not in {to for tos in ALLOWED.values() for to in tos}
    assert ALLOWED[TurnState.queued] == {TurnState.received} | TERMINAL_TURN_STATES


@pytest.mark.parametrize("running", sorted(set(TurnState) - TERMINAL_TURN_STATES))
def test_a_running_turn_can_always_end(running: TurnState) -> None:
    assert TERMINAL_TURN_STATES <= ALLOWED[running]


def test_the_moves_the_engine_makes_are_allowed() -> None:
    path = [
        TurnState.received,
        TurnState.building_context,
        TurnState.calling_model,
        TurnState.executing_tools,
        TurnState.calling_model,
        TurnState.awaiting_confirmation,
        TurnState.executing_action,
        TurnState.calling_model,
        TurnState.completed,
    ]
    assert all(can_move(a, b) for a, b in zip(path, path[1:], strict=False))
    assert can_move(TurnState.awaiting_confirmation, TurnState.calling_model)  # declined
    assert can_move(TurnState.awaiting_confirmation, TurnState.expired)
    assert not can_move(TurnState.calling_model, TurnState.received)
    assert not can_move(TurnState.received, TurnState.executing_action)


async def _new_turn(db: Db) -> Turn:
    # No workflow runs this turn: the worker's outbox sweep is kept away from it.
    return (await post_unstarted(db, owner=PRIYA, text="Where is my order?")).turn


async def _row(sessions: Database, turn_id: str) -> tuple[str, int]:
    async with orm(sessions) as db:
        turn = await db.get(Turn, turn_id)
        assert turn is not None
        return turn.state, turn.last_event_id


async def test_an_illegal_move_is_refused_and_leaves_the_row_unchanged(
    sessions: Database,
) -> None:
    async with sessions() as db:
        turn = await _new_turn(db)
    before = await _row(sessions, turn.id)
    async with sessions() as db:
        with pytest.raises(IllegalTransition):
            await turns.move_turn(db, turn_id=turn.id, to=TurnState.executing_action)
        await db.commit()
    assert await _row(sessions, turn.id) == before == (TurnState.received, before[1])

    async with sessions() as db:
        assert await turns.move_turn(db, turn_id=turn.id, to=TurnState.building_context)
        assert not await turns.move_turn(db, turn_id=turn.id, to=TurnState.building_context)
        await db.commit()
    state, last_event = await _row(sessions, turn.id)
    assert (state, last_event) == (TurnState.building_context, before[1] + 1)


async def test_a_finished_turn_never_moves_again(
    sessions: Database,
) -> None:
    async with sessions() as db:
        turn = await _new_turn(db)
        await turns.end_unfinished_turn(db, turn_id=turn.id, state=TurnState.cancelled)
        await db.commit()
    ended = await _row(sessions, turn.id)
    assert ended[0] == TurnState.cancelled
    async with sessions() as db:
        with pytest.raises(IllegalTransition):
            await turns.move_turn(db, turn_id=turn.id, to=TurnState.calling_model)
        # A step that a cancel raced refuses to run and changes nothing.
        with pytest.raises(turns.TurnStopped):
            await turns.advance_turn(db, turn_id=turn.id, to=TurnState.calling_model)
        await db.commit()
    assert await _row(sessions, turn.id) == ended


async def _propose(db: Db, turn: Turn) -> None:
    await actions.create_action(
        db,
        turn=turn,
        action_id=f"act_{uuid.uuid4().hex[:12]}",
        tool="send_email",
        args={"order_id": "8472"},
        summary="Email the status of order 8472",
        recipient_masked="p***@example.com",
        ttl=timedelta(minutes=10),
    )


async def test_no_card_outlives_a_stop_whichever_commits_first(
    sessions: Database,
) -> None:
    # The Stop first: a proposal step that finishes afterwards records no card.
    async with sessions() as db:
        stopped = await _new_turn(db)
        await turns.request_cancel(db, turn_id=stopped.id)
        await db.commit()
    async with sessions() as db:
        with pytest.raises(turns.TurnStopped):
            await _propose(db, stopped)
        await db.rollback()
        card = "SELECT 1 FROM actions WHERE turn_id = %(t)s"
        assert await db.value(card, {"t": stopped.id}) is None

    # The proposal first: the ending that follows declines it, so no card stays pending.
    async with sessions() as db:
        proposed = await _new_turn(db)
        await _propose(db, proposed)
        await db.commit()
    async with sessions() as db:
        await turns.end_unfinished_turn(db, turn_id=proposed.id, state=TurnState.cancelled)
        await db.commit()
    async with orm(sessions) as db:
        action = await db.scalar(select(Action).where(Action.turn_id == proposed.id))
    assert action is not None and action.status != "pending"
