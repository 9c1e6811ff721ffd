"""A queued message as the session API shows it (issue 30 item 4): on the session a reloaded
page reads, refused again with other text under the same key, and dropped with its session;
started when the running turn ends by a worker of the queue its API posts to (the ring of
its promotion names that queue). The outbox loop's sweep and its start of a promoted turn
whose ring names no queue are tests/system/test_queued_turns.py (that loop runs in
`parley worker` only)."""

from __future__ import annotations

import asyncio
import uuid

from sqlalchemy import select

from parley.contracts import TurnState
from parley.store import queue
from parley.store.db import Database
from parley.store.identity import Identity
from parley.store.models import Turn
from parley.store.sessions import lock_session
from tests.support.client import ParleyClient
from tests.support.orm import orm
from tests.support.toolkit import eventually, propose

PRIYA = Identity(tenant_id="northwind", user_id="cust_2291", roles=())


async def test_the_session_shows_its_queued_message_and_drops_it_when_deleted(
    priya: ParleyClient, sessions: Database
) -> None:
    sid = await priya.new_session()
    first = await priya.post(sid, "Tell me everything about my orders")
    key = uuid.uuid4().hex
    queued = await priya.post(sid, "Is a refund possible?", client_message_id=key)
    assert queued.json()["state"] == "queued"
    queued_id = queued.json()["turn_id"]

    shown = (await priya.http.get(f"/v1/sessions/{sid}")).json()
    assert shown["active_turn"]["id"] == first.json()["turn_id"]
    assert shown["queued_message"]["turn_id"] == queued_id
    assert shown["queued_message"]["text"] == "Is a refund possible?"
    assert shown["last_seq"] == 1  # it has no seq while it waits
    reused = await priya.post(sid, "Something else", client_message_id=key)
    assert reused.status_code == 422
    assert reused.json()["error"]["code"] == "idempotency_key_reused"
    stale = await priya.post(sid, "Hello?", expected_last_seq=0)
    assert stale.status_code == 409 and stale.json()["error"]["code"] == "stale_view"

    assert (await priya.http.delete(f"/v1/sessions/{sid}")).status_code == 204

    async def ended() -> bool:
        async with orm(sessions) as db:
            states = dict(
                (await db.execute(select(Turn.id, Turn.state).where(Turn.session_id == sid))).all()
            )
        return states[queued_id] == TurnState.cancelled and (
            states[first.json()["turn_id"]] == TurnState.cancelled
        )

    await eventually(ended, timeout=30, what="both turns of the deleted session end")


async def test_a_turn_resting_on_a_card_with_a_message_queued_takes_only_its_decision(
    priya: ParleyClient, sessions: Database
) -> None:
    """The message queued while the turn ran goes first: another message is 409 until the
    resting turn ends; a typed yes still answers the card, and the turn's end promotes it."""
    sid = await priya.new_session()
    turn_id, events, _ = await propose(priya, sid)
    # As if posted while the proposal streamed (the classification queued it then).
    async with sessions() as db:
        session = await lock_session(db, owner=PRIYA, session_id=sid)
        queued = await queue.queue_message(
            db,
            session=session,
            owner=PRIYA,
            client_message_id=uuid.uuid4().hex,
            text="And my refund?",
            file_ids=(),
        )
        await db.commit()
    moved_on = await priya.post(sid, "Actually, never mind the email")
    assert moved_on.status_code == 409
    assert moved_on.json()["error"]["code"] == "turn_in_progress"

    decided = await priya.post(sid, "yes")
    assert decided.status_code == 202 and decided.json()["turn_id"] == turn_id
    rest = await priya.events(sid, turn_id, last_event_id=events[-1].id)
    assert rest[-1].type == "done"
    promoted = await priya.http.get(f"/v1/sessions/{sid}/turns/{queued.turn.id}")
    # Queued by the store with no task queue (as a release before it was recorded did), its
    # ring names none: only an outbox loop starts it, and none runs in this tier.
    assert promoted.json()["state"] == "received"
    said = [m["text"] for m in await priya.messages(sid) if m["role"] == "user"]
    assert said[-2:] == ["yes", "And my refund?"]
    await priya.http.post(f"/v1/sessions/{sid}/turns/{queued.turn.id}/cancel")


async def test_a_message_queued_through_the_api_is_answered_once_the_running_turn_ends(
    priya: ParleyClient,
) -> None:
    sid = await priya.new_session()
    first = await priya.post(sid, "Tell me everything about my orders")
    queued = await priya.post(sid, "Is a refund possible?")
    assert queued.json()["state"] == "queued"
    # The running turn's end promotes it and rings the queue this API posts to: the stack's
    # worker, which runs no outbox loop and no sweep, starts it from that ring.
    ran = await asyncio.wait_for(priya.events(sid, queued.json()["turn_id"]), 60)
    assert ran[-1].type == "done"
    assert [e.data["state"] for e in ran if e.type == "state"][:2] == ["queued", "received"]
    said = [m["text"] for m in await priya.messages(sid) if m["role"] == "user"]
    assert said == ["Tell me everything about my orders", "Is a refund possible?"]
    shown = (await priya.http.get(f"/v1/sessions/{sid}")).json()
    assert shown["active_turn"] is None and shown["queued_message"] is None
    assert first.json()["turn_id"] != queued.json()["turn_id"]
