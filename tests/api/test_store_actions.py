"""The pending-action statements (store/actions.py) against the real database: the typed rows
they return, the proposal that a retry finds again and a stopped turn never gets, and the
status change that only one answer wins."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from parley.contracts import EventType
from parley.errors import ActionChanged, ActionExpired, ActionResolved, NotFound
from parley.statuses import ActionStatus, Decision
from parley.store import actions, handoffs, turns
from parley.store.actions import ActionRow, ForeignRow, ToSend
from parley.store.db import Database, connect
from parley.store.identity import Identity
from parley.store.turns.reads import TurnFacts, turn_facts
from parley.tools import args_hash
from tests.support.toolkit import post_unstarted

Sessions = Database
PRIYA = Identity(tenant_id="northwind", user_id="cust_2291", roles=())
MARCO = Identity(tenant_id="northwind", user_id="cust_3301", roles=())
ARGS = {"to": "priya@example.com", "subject": "Order 8472", "body": "It ships Monday."}


async def _running_turn(sessions: Sessions) -> TurnFacts:
    """A turn of Priya's that no workflow runs (the outbox sweep is kept away from it)."""
    async with sessions() as db:
        posted = await post_unstarted(db, owner=PRIYA, text="Can you email me?")
    async with connect(sessions) as conn:
        turn = await turn_facts(conn, turn_id=posted.turn.id)
    assert turn is not None
    return turn


async def _propose(
    sessions: Sessions, turn: TurnFacts, *, ttl: timedelta = timedelta(minutes=10)
) -> ActionRow:
    async with connect(sessions) as conn:
        return await actions.create_action(
            conn,
            turn=turn,
            action_id=f"act_{uuid.uuid4().hex[:12]}",
            tool="send_email",
            args=ARGS,
            summary="Email the status of order 8472",
            recipient_masked="p***@example.com",
            ttl=ttl,
        )


async def _events(sessions: Sessions, turn_id: str) -> list[str]:
    async with connect(sessions) as conn:
        found = await conn.rows(
            "SELECT type FROM turn_events WHERE turn_id = %(t)s ORDER BY id", {"t": turn_id}, _Type
        )
    return [e.type for e in found]


@dataclasses.dataclass(frozen=True)
class _Type:
    type: str


async def test_a_proposal_is_a_frozen_row_that_a_retry_finds_again(sessions: Sessions) -> None:
    turn = await _running_turn(sessions)
    action = await _propose(sessions, turn)
    assert isinstance(action, ActionRow)
    assert (action.status, action.turn_id, action.session_id) == (
        "pending",
        turn.id,
        turn.session_id,
    )
    assert (action.tenant_id, action.user_id) == (PRIYA.tenant_id, PRIYA.user_id)
    assert action.args == ARGS and action.args_hash == args_hash("send_email", ARGS)
    assert action.expires_at > datetime.now(UTC) + timedelta(minutes=9)
    assert action.resolved_at is None and action.outcome is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        action.status = ActionStatus.confirmed  # type: ignore[misc]
    # A retried attempt (other words, same derived id) gets the row the first one wrote.
    async with sessions() as db:  # and the API's session works the same
        again = await actions.create_action(
            db,
            turn=turn,
            action_id=action.id,
            tool="send_email",
            args=ARGS,
            summary="something else",
            recipient_masked=None,
            ttl=timedelta(minutes=1),
        )
        await db.commit()
    assert again == action
    # The same id under another turn is a bug, never handed back.
    other = await _running_turn(sessions)
    async with connect(sessions) as conn:
        with pytest.raises(ForeignRow):
            await actions.create_action(
                conn,
                turn=other,
                action_id=action.id,
                tool="send_email",
                args=ARGS,
                summary="x",
                recipient_masked=None,
                ttl=timedelta(minutes=1),
            )
        assert await actions.get_action(conn, action_id=action.id) == action
        assert await actions.action_to_send(conn, action_id=action.id) == ToSend(action, False)
        assert await actions.action_to_send(conn, action_id="act_that_is_not") is None
        assert await actions.latest_action(conn, turn_id=turn.id) == action
        assert await actions.latest_action(conn, turn_id=other.id) is None
        assert await actions.pending_action(conn, session_id=turn.session_id) == action
        pending = (ActionStatus.pending,)
        assert await actions.actions_in(conn, turn_id=turn.id, statuses=pending) == [action]
        confirmed = (ActionStatus.confirmed,)
        assert await actions.actions_in(conn, turn_id=turn.id, statuses=confirmed) == []


async def test_a_stopped_turn_gets_no_card(sessions: Sessions) -> None:
    turn = await _running_turn(sessions)
    async with sessions() as db:
        await turns.request_cancel(db, turn_id=turn.id)
        await db.commit()
    with pytest.raises(turns.TurnStopped):
        await _propose(sessions, turn)
    async with connect(sessions) as conn:
        assert await actions.latest_action(conn, turn_id=turn.id) is None


async def test_one_answer_resolves_a_card_and_a_second_is_refused(sessions: Sessions) -> None:
    turn = await _running_turn(sessions)
    action = await _propose(sessions, turn)
    async with sessions() as db:
        with pytest.raises(NotFound):  # another user's answer finds nothing to answer
            await actions.resolve_action(
                db,
                action_id=action.id,
                session_id=turn.session_id,
                owner=MARCO,
                decision=Decision.confirmed,
            )
        confirmed = await actions.resolve_action(
            db,
            action_id=action.id,
            session_id=turn.session_id,
            owner=PRIYA,
            decision=Decision.confirmed,
        )
        await db.commit()
    assert confirmed.status == ActionStatus.confirmed and confirmed.resolved_at is not None
    assert (await _events(sessions, turn.id))[-1] == EventType.confirmation_resolved
    async with sessions() as db:
        with pytest.raises(ActionResolved) as refused:
            await actions.resolve_action(
                db,
                action_id=action.id,
                session_id=turn.session_id,
                owner=PRIYA,
                decision=Decision.declined,
            )
    assert refused.value.extra["action"]["status"] == "confirmed"
    async with connect(sessions) as conn:
        # The status change itself refuses to leave a status it was not given.
        pending = (ActionStatus.pending,)
        assert (
            await actions.set_action_status(
                conn, action_id=action.id, status=ActionStatus.expired, only_from=pending
            )
            is None
        )
        assert await actions.get_action(conn, action_id=action.id) == confirmed


async def test_two_answers_at_once_resolve_the_card_once(sessions: Sessions) -> None:
    turn = await _running_turn(sessions)
    action = await _propose(sessions, turn)

    async def answer(decision: Decision) -> str:
        async with sessions() as db:
            try:
                row = await actions.resolve_action(
                    db,
                    action_id=action.id,
                    session_id=turn.session_id,
                    owner=PRIYA,
                    decision=decision,
                )
            except ActionResolved:
                return "refused"
            await db.commit()
            return row.status

    answers = await asyncio.gather(answer(Decision.confirmed), answer(Decision.declined))
    assert sorted(answers)[-1] == "refused" and answers.count("refused") == 1
    won = next(a for a in answers if a != "refused")
    async with connect(sessions) as conn:
        stored = await actions.get_action(conn, action_id=action.id)
    assert stored is not None and stored.status == won
    assert (await _events(sessions, turn.id)).count(EventType.confirmation_resolved) == 1


async def test_a_late_answer_stores_the_card_expired(sessions: Sessions) -> None:
    turn = await _running_turn(sessions)
    action = await _propose(sessions, turn, ttl=timedelta(seconds=-1))
    async with sessions() as db:
        with pytest.raises(ActionExpired):
            await actions.resolve_action(
                db,
                action_id=action.id,
                session_id=turn.session_id,
                owner=PRIYA,
                decision=Decision.confirmed,
            )
        await db.commit()  # as the API does: the expiry stands, whatever the answer
    async with connect(sessions) as conn:
        stored = await actions.get_action(conn, action_id=action.id)
    assert stored is not None and stored.status == ActionStatus.expired
    assert stored.resolved_at is not None
    async with sessions() as db:
        with pytest.raises(ActionExpired):
            await actions.resolve_action(
                db,
                action_id=action.id,
                session_id=turn.session_id,
                owner=None,
                decision=Decision.declined,
            )


async def test_changed_arguments_refuse_a_confirm_but_not_a_decline(sessions: Sessions) -> None:
    turn = await _running_turn(sessions)
    action = await _propose(sessions, turn)
    async with connect(sessions) as conn:
        await conn.run(
            'UPDATE actions SET args = args || \'{"to": "evil@example.com"}\' WHERE id = %(id)s',
            {"id": action.id},
        )
    async with sessions() as db:
        with pytest.raises(ActionChanged):
            await actions.resolve_action(
                db,
                action_id=action.id,
                session_id=turn.session_id,
                owner=PRIYA,
                decision=Decision.confirmed,
            )
        await db.rollback()
        declined = await actions.resolve_action(
            db,
            action_id=action.id,
            session_id=turn.session_id,
            owner=PRIYA,
            decision=Decision.declined,
            reason="not_now",
        )
        await db.commit()
    assert (declined.status, declined.decline_reason) == ("declined", "not_now")


async def test_a_send_outcome_and_a_supersede_are_one_statement_each(sessions: Sessions) -> None:
    turn = await _running_turn(sessions)
    card = await _propose(sessions, turn)
    async with connect(sessions) as conn:
        superseded = await actions.set_action_status(
            conn,
            action_id=card.id,
            status=ActionStatus.superseded,
            only_from=(ActionStatus.pending,),
        )
        assert superseded is not None and superseded.status == ActionStatus.superseded
        assert superseded.resolved_at is not None
        # A send's outcome keeps the answer's time and reason.
        sent = await actions.set_action_status(
            conn,
            action_id=card.id,
            status=ActionStatus.executed,
            only_from=(ActionStatus.superseded,),
            outcome={"accepted": True, "message_id": "m1"},
        )
    assert sent is not None and sent.outcome == {"accepted": True, "message_id": "m1"}
    assert (sent.resolved_at, sent.decline_reason) == (superseded.resolved_at, None)


async def test_a_hand_off_is_made_once(sessions: Sessions) -> None:
    turn = await _running_turn(sessions)
    handoff_id = f"ho_{uuid.uuid4().hex[:12]}"
    fields = {"handoff_id": handoff_id, "session_id": turn.session_id, "turn_id": turn.id}
    async with connect(sessions) as conn:
        first, opened = await handoffs.open_handoff(conn, **fields, reason="a person, please")
        again, reopened = await handoffs.open_handoff(conn, **fields, reason="asked again")
        assert first == again and (first.reason, first.status) == ("a person, please", "waiting")
        assert (opened, reopened) == (True, False)
        other = await _running_turn(sessions)
        with pytest.raises(ForeignRow):
            await handoffs.open_handoff(
                conn,
                handoff_id=handoff_id,
                session_id=other.session_id,
                turn_id=other.id,
                reason="x",
            )
