"""Confirmations: a proposed email is sent once, only on its own user's bound answer.

Covers the Confirmations contract of api.md end to end through HTTP, SSE and the Northwind
email service: double and concurrent confirms, expiry (through a second API whose
confirmation window is two seconds), other users, changed arguments, decline, typed yes,
supersede, and the session view while a turn rests awaiting confirmation.

Emails are counted per action key (`parley-<action id>`), never globally: other tests share
the demo backend.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import httpx
import pytest_asyncio
from sqlalchemy import update

from parley.config import Settings
from parley.store.db import Database
from parley.store.models import Action
from tests.support.client import ParleyClient
from tests.support.orm import orm
from tests.support.sse import Event
from tests.support.stack import serve_api
from tests.support.toolkit import emails, propose, reply, types, wait_for_view_state

EXPIRING_TIMEOUT_S = 2.0


# --- helpers -------------------------------------------------------------------------------


def confirm_url(sid: str, action_id: str, verb: str = "confirm") -> str:
    return f"/v1/sessions/{sid}/actions/{action_id}/{verb}"


async def confirm(client: ParleyClient, sid: str, action_id: str) -> httpx.Response:
    return await client.http.post(confirm_url(sid, action_id))


async def decline(client: ParleyClient, sid: str, action_id: str) -> httpx.Response:
    return await client.http.post(confirm_url(sid, action_id, "decline"))


def error_code(response: httpx.Response) -> str:
    return str(response.json()["error"]["code"])


def resolved_statuses(events: list[Event]) -> list[str]:
    return [e.data["action"]["status"] for e in events if e.type == "confirmation_resolved"]


async def rest(client: ParleyClient, sid: str, turn_id: str, after: int) -> list[Event]:
    """The rest of a waiting turn's stream, once its action is resolved (bounded)."""
    return await asyncio.wait_for(client.events(sid, turn_id, last_event_id=after), 30)


# --- 8. the session view while resting -------------------------------------------------------


async def test_session_view_while_awaiting_confirmation(
    priya: ParleyClient, northwind: httpx.AsyncClient
) -> None:
    sid = await priya.new_session()
    turn_id, events, action = await propose(priya, sid)

    view = await priya.session_view(sid)
    assert view["active_turn"]["id"] == turn_id
    assert view["active_turn"]["state"] == "awaiting_confirmation"
    assert view["pending_action"] == action  # rendered from the stored row, as streamed
    assert view["active_turn"]["pending_action"] == action
    assert (await priya.turn_view(sid, turn_id))["pending_action"] == action
    assert action["recipient_masked"] == "p***@example.com"
    assert await emails(northwind, action_id=action["id"]) == []

    # Tidy up: decline so the workflow does not wait out its window.
    assert (await decline(priya, sid, action["id"])).status_code == 202
    assert (await rest(priya, sid, turn_id, events[-1].id or 0))[-1].type == "done"


# --- 1. confirming twice -----------------------------------------------------------------


async def delivered(sessions: Database, action_id: str) -> bool:
    """The decision reached its turn: its outbox row is marked (dispatch/control.py)."""
    async with orm(sessions) as db:
        action = await db.get(Action, action_id)
    assert action is not None
    return action.decision_delivered_at is not None


async def test_confirm_twice_sends_one_email(
    priya: ParleyClient, northwind: httpx.AsyncClient, sessions: Database
) -> None:
    sid = await priya.new_session()
    turn_id, events, action = await propose(priya, sid)
    aid = action["id"]

    first = await confirm(priya, sid, aid)
    assert first.status_code == 202, first.text
    assert first.json()["action"]["id"] == aid
    assert first.json()["action"]["status"] == "confirmed"
    assert await delivered(sessions, aid)  # by the route itself: nothing left for the sweep
    second = await confirm(priya, sid, aid)
    assert second.status_code == 409, second.text
    assert error_code(second) == "action_resolved"

    rest_events = await rest(priya, sid, turn_id, events[-1].id or 0)
    assert resolved_statuses(rest_events) == ["confirmed"]
    text = reply(rest_events).lower()
    assert "sent" in text or "accepted" in text
    assert (await priya.turn_view(sid, turn_id))["state"] == "completed"

    sent = await emails(northwind, action_id=aid)
    assert [e["to"] for e in sent] == ["priya@example.com"]
    third = await confirm(priya, sid, aid)  # after execution: still resolved, nothing more
    assert third.status_code == 409 and error_code(third) == "action_resolved"
    assert len(await emails(northwind, action_id=aid)) == 1


async def test_concurrent_confirms_send_one_email(
    priya: ParleyClient, northwind: httpx.AsyncClient
) -> None:
    sid = await priya.new_session()
    turn_id, events, action = await propose(priya, sid)
    aid = action["id"]

    answers = await asyncio.gather(confirm(priya, sid, aid), confirm(priya, sid, aid))
    statuses = sorted(r.status_code for r in answers)
    assert statuses == [202, 409], [r.text for r in answers]
    loser = next(r for r in answers if r.status_code == 409)
    assert error_code(loser) == "action_resolved"

    rest_events = await rest(priya, sid, turn_id, events[-1].id or 0)
    assert resolved_statuses(rest_events) == ["confirmed"]
    assert reply(rest_events)
    assert len(await emails(northwind, action_id=aid)) == 1


# --- 2. expiry -----------------------------------------------------------------------------


@pytest_asyncio.fixture
async def expiring_priya(
    settings: Settings, tokens: dict[str, str], api_url: str
) -> AsyncIterator[ParleyClient]:
    """Priya on a second API (same task queue, same worker) whose confirmation window is
    two seconds; `api_url` is requested so the session's worker is running."""
    short = settings.model_copy(update={"confirmation_timeout_s": EXPIRING_TIMEOUT_S})
    async with serve_api(short) as url:
        client = ParleyClient(url, tokens["priya"])
        try:
            yield client
        finally:
            await client.aclose()


async def test_confirm_after_expiry(
    expiring_priya: ParleyClient, northwind: httpx.AsyncClient
) -> None:
    client = expiring_priya
    sid = await client.new_session()
    turn_id, events, action = await propose(client, sid)
    aid = action["id"]

    # The turn ends by itself once the window passes; nobody has to confirm or decline.
    view = await wait_for_view_state(
        client, sid, turn_id, "expired", timeout=EXPIRING_TIMEOUT_S + 13
    )
    assert view["pending_action"] is None

    late = await confirm(client, sid, aid)
    assert late.status_code == 409, late.text
    assert error_code(late) == "action_expired"
    assert late.json()["error"]["action"]["status"] == "expired"

    rest_events = await rest(client, sid, turn_id, events[-1].id or 0)
    assert resolved_statuses(rest_events) == ["expired"]
    assert types(rest_events)[-1] == "done"
    resolved_at = types(rest_events).index("confirmation_resolved")
    assert resolved_at < len(rest_events) - 1
    text = reply(rest_events).lower()
    assert "not send" in text or "not sent" in text or "didn't send" in text, text
    assert {"state": "expired"} in [e.data for e in rest_events if e.type == "state"]

    session = await client.session_view(sid)
    assert session["active_turn"] is None and session["pending_action"] is None
    assert await emails(northwind, action_id=aid) == []
    # A decline after expiry is the same conflict.
    late_decline = await decline(client, sid, aid)
    assert late_decline.status_code == 409 and error_code(late_decline) == "action_expired"


# --- 3. another user's action ---------------------------------------------------------------


async def test_confirm_by_another_user_is_not_found(
    priya: ParleyClient,
    marco: ParleyClient,
    tokens: dict[str, str],
    api_url: str,
    northwind: httpx.AsyncClient,
) -> None:
    sid = await priya.new_session()
    turn_id, events, action = await propose(priya, sid)
    aid = action["id"]
    missing = "act_" + uuid.uuid4().hex[:24]

    ines = ParleyClient(api_url, tokens["ines"])
    try:
        for other in (marco, ines):
            own_sid = await other.new_session()
            for verb in ("confirm", "decline"):
                # Through Priya's session: the same answer as for an action that does not exist.
                theirs = await other.http.post(confirm_url(sid, aid, verb))
                nothing = await other.http.post(confirm_url(sid, missing, verb))
                assert theirs.status_code == 404, theirs.text
                assert theirs.json() == nothing.json()
                assert theirs.json()["error"]["code"] == "not_found"
                # Through the caller's own session: the same again.
                theirs = await other.http.post(confirm_url(own_sid, aid, verb))
                nothing = await other.http.post(confirm_url(own_sid, missing, verb))
                assert theirs.status_code == 404, theirs.text
                assert theirs.json() == nothing.json()
                assert theirs.json()["error"]["code"] == "not_found"
    finally:
        await ines.aclose()

    # Nothing moved: still pending, nothing sent, and Priya can still confirm.
    view = await priya.session_view(sid)
    assert view["pending_action"] == action
    assert view["active_turn"]["state"] == "awaiting_confirmation"
    assert await emails(northwind, action_id=aid) == []

    mine = await confirm(priya, sid, aid)
    assert mine.status_code == 202, mine.text
    rest_events = await rest(priya, sid, turn_id, events[-1].id or 0)
    assert resolved_statuses(rest_events) == ["confirmed"]
    assert reply(rest_events)
    assert [e["to"] for e in await emails(northwind, action_id=aid)] == ["priya@example.com"]


# --- 4. changed arguments --------------------------------------------------------------------


async def test_confirm_after_arguments_changed(
    priya: ParleyClient,
    northwind: httpx.AsyncClient,
    sessions: Database,
) -> None:
    sid = await priya.new_session()
    turn_id, events, action = await propose(priya, sid)
    aid = action["id"]
    attacker = f"mallory-{uuid.uuid4().hex[:8]}@example.net"

    async with orm(sessions) as db:
        stored = await db.get(Action, aid)
        assert stored is not None
        args = {**stored.args, "to": attacker}
        await db.execute(update(Action).where(Action.id == aid).values(args=args))
        await db.commit()

    changed = await confirm(priya, sid, aid)
    assert changed.status_code == 409, changed.text
    assert error_code(changed) == "action_changed"
    # Nothing sent now; a send wrongly started by this confirm would still be in the turn,
    # so the checks after the turn has ended (below) are the ones no timing can fool.
    assert await emails(northwind, action_id=aid) == []
    assert [e for e in await emails(northwind) if e["to"] == attacker] == []
    assert (await priya.turn_view(sid, turn_id))["state"] == "awaiting_confirmation"

    # Tidy up: a decline needs no matching arguments and ends the turn; still nothing sent.
    assert (await decline(priya, sid, aid)).status_code == 202
    rest_events = await rest(priya, sid, turn_id, events[-1].id or 0)
    assert resolved_statuses(rest_events) == ["declined"]
    assert await emails(northwind, action_id=aid) == []
    assert [e for e in await emails(northwind) if e["to"] == attacker] == []


# --- 5. decline ------------------------------------------------------------------------------


async def test_decline(priya: ParleyClient, northwind: httpx.AsyncClient) -> None:
    sid = await priya.new_session()
    turn_id, events, action = await propose(priya, sid)
    aid = action["id"]

    declined = await decline(priya, sid, aid)
    assert declined.status_code == 202, declined.text
    assert declined.json()["action"]["status"] == "declined"

    rest_events = await rest(priya, sid, turn_id, events[-1].id or 0)
    assert resolved_statuses(rest_events) == ["declined"]
    text = reply(rest_events).lower()
    assert "won't send" in text or "will not send" in text, text
    assert (await priya.turn_view(sid, turn_id))["state"] == "completed"

    late = await confirm(priya, sid, aid)
    assert late.status_code == 409, late.text
    assert error_code(late) == "action_resolved"
    again = await decline(priya, sid, aid)
    assert again.status_code == 409 and error_code(again) == "action_resolved"
    view = await priya.session_view(sid)
    assert view["active_turn"] is None and view["pending_action"] is None
    assert await emails(northwind, action_id=aid) == []


# --- 6. typed yes ----------------------------------------------------------------------------


async def test_typed_yes_answers_the_waiting_turn(
    priya: ParleyClient, northwind: httpx.AsyncClient
) -> None:
    sid = await priya.new_session()
    turn_id, events, action = await propose(priya, sid)
    aid = action["id"]

    key = uuid.uuid4().hex
    yes = await priya.post(sid, "Yes, send it", client_message_id=key)
    assert yes.status_code == 202, yes.text
    assert yes.json()["turn_id"] == turn_id  # the message joins the waiting turn
    assert yes.json()["message"]["role"] == "user"

    rest_events = await rest(priya, sid, turn_id, events[-1].id or 0)
    assert resolved_statuses(rest_events) == ["confirmed"]
    text = reply(rest_events).lower()
    assert "sent" in text or "accepted" in text
    assert [e["to"] for e in await emails(northwind, action_id=aid)] == ["priya@example.com"]
    stored = await priya.messages(sid)

    repeat = await priya.post(sid, "Yes, send it", client_message_id=key)
    assert repeat.status_code == 200, repeat.text
    assert repeat.json()["turn_id"] == turn_id
    assert repeat.json()["message"]["id"] == yes.json()["message"]["id"]
    # The repeat started nothing: no new message, no turn open, the old turn stays finished
    # (a finished turn's workflow cannot send again), so there is nothing to wait out.
    assert await priya.messages(sid) == stored
    view = await priya.session_view(sid)
    assert view["active_turn"] is None and view["pending_action"] is None
    assert (await priya.turn_view(sid, turn_id))["state"] == "completed"
    assert len(await emails(northwind, action_id=aid)) == 1


# --- 7. supersede ----------------------------------------------------------------------------


async def test_new_message_supersedes_the_pending_action(
    priya: ParleyClient, northwind: httpx.AsyncClient, sessions: Database
) -> None:
    sid = await priya.new_session()
    turn_id, events, action = await propose(priya, sid)
    aid = action["id"]

    posted = await priya.post(sid, "What about the refund?")
    assert posted.status_code == 202, posted.text
    assert await delivered(sessions, aid)
    new_turn = str(posted.json()["turn_id"])
    assert new_turn != turn_id
    view = await priya.session_view(sid)
    assert view["pending_action"] is None
    assert view["active_turn"] is None or view["active_turn"]["id"] == new_turn

    old_rest = await rest(priya, sid, turn_id, events[-1].id or 0)
    # Its own outcome, not the user's "no".
    assert resolved_statuses(old_rest) == ["superseded"]
    assert types(old_rest)[-1] == "done"
    new_events = await asyncio.wait_for(priya.events(sid, new_turn), 30)
    assert new_events[-1].type == "done", types(new_events)

    view = await priya.session_view(sid)
    assert view["pending_action"] is None
    assert view["active_turn"] is None
    late = await confirm(priya, sid, aid)
    assert late.status_code == 409, late.text
    assert error_code(late) == "action_superseded"
    assert await emails(northwind, action_id=aid) == []


async def test_confirm_after_expires_at_but_before_the_timer(
    expiring_priya: ParleyClient,
    northwind: httpx.AsyncClient,
    sessions: Database,
) -> None:
    """The action's window closes (expires_at) a little before the workflow's timer fires
    (the timer starts after the next model call). A confirm in that gap is refused as
    expired, and the turn's stream still tells the client the card was resolved."""
    client = expiring_priya
    sid = await client.new_session()
    turn_id, events, action = await propose(client, sid)
    aid = action["id"]
    async with orm(sessions) as db:  # widen the gap deterministically: the window has passed
        past = datetime.now(UTC) - timedelta(seconds=1)
        await db.execute(update(Action).where(Action.id == aid).values(expires_at=past))
        await db.commit()

    late = await confirm(client, sid, aid)
    assert late.status_code == 409, late.text
    assert error_code(late) == "action_expired"

    rest_events = await rest(client, sid, turn_id, events[-1].id or 0)
    assert types(rest_events)[-1] == "done"
    assert (await client.turn_view(sid, turn_id))["state"] == "expired"
    assert await emails(northwind, action_id=aid) == []
    assert resolved_statuses(rest_events) == ["expired"], types(rest_events)
