"""Approvals with an honest clock (issue 42, acceptance 6), end to end through HTTP, the event
log, the worker and the Northwind email service: a card carries its expiry, a warning comes
before it lapses, an expired card is asked for again as a new card with the same digest that
one confirm sends once, and only its own user, with the assistant still enabled, may ask.

The API here has a confirmation window of a few seconds (the worker is the session's: the
window travels with each turn). The warning is shown by the worker's outbox sweep, which the
test stack keeps idle; the test runs the sweep's step itself (`warn_expiring`) until the
warning is written, under a deadline, as `parley worker` does every `PARLEY_OUTBOX_POLL_S`.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import httpx
import pytest_asyncio
from prometheus_client import REGISTRY
from sqlalchemy import insert, update
from temporalio.client import Client

from parley.activities.send import SendActivities
from parley.config import Settings
from parley.contracts import ActionInput
from parley.dispatch.approvals import warn_expiring
from parley.features import ASSISTANT
from parley.ids import renewal_action_id, renewal_workflow_id
from parley.statuses import ActionStatus
from parley.store import actions, approvals, tenants
from parley.store.db import Database, connect
from parley.store.identity import Identity, create_token, set_feature
from parley.store.models import Action, User
from parley.store.turns.reads import turn_facts
from parley.tenancy import TenantConfig
from parley.workflows.renewal import RenewalWorkflow
from tests.support.client import ParleyClient
from tests.support.histories import replayer
from tests.support.orm import orm
from tests.support.stack import serve_api
from tests.support.tenants import new_admin_tenant
from tests.support.toolkit import emails, eventually, post_unstarted, propose, types
from tests.support.toolkit import wait_for_view_state as view_state

WINDOW_S = 8.0  # the card's window on this API
LEAD_S = 5.0  # the warning's lead time, as the deployment's default


@pytest_asyncio.fixture
async def short_window(settings: Settings, api_url: str) -> AsyncIterator[str]:
    """A second API (same worker, same task queue) whose cards lapse after `WINDOW_S`;
    `api_url` is requested so the session's worker is running."""
    short = settings.model_copy(update={"confirmation_timeout_s": WINDOW_S})
    async with serve_api(short) as url:
        yield url


@pytest_asyncio.fixture
async def priya_short(short_window: str, tokens: dict[str, str]) -> AsyncIterator[ParleyClient]:
    client = ParleyClient(short_window, tokens["priya"])
    yield client
    await client.aclose()


@pytest_asyncio.fixture
async def marco_short(short_window: str, tokens: dict[str, str]) -> AsyncIterator[ParleyClient]:
    client = ParleyClient(short_window, tokens["marco"])
    yield client
    await client.aclose()


def renew_url(sid: str, action_id: str, verb: str = "renew") -> str:
    return f"/v1/sessions/{sid}/actions/{action_id}/{verb}"


def code(response: httpx.Response) -> str:
    return str(response.json()["error"]["code"])


async def model_calls(sessions: Database, turn_id: str) -> int:
    async with connect(sessions) as conn:
        found = await conn.value(
            "SELECT count(*) FROM model_calls WHERE turn_id = %(t)s", {"t": turn_id}
        )
    return int(found or 0)


def counted(name: str, **labels: str) -> float:
    """A counter of this process (the API and the test stack's worker run here)."""
    return REGISTRY.get_sample_value(name, labels) or 0.0


OUTCOMES = "parley_confirmation_outcomes_total"


async def warned(sessions: Database) -> int:
    """One round of the sweep's warning step (dispatch/approvals.py)."""
    return await warn_expiring(sessions, default_lead_s=LEAD_S)


async def test_a_card_warns_expires_and_is_renewed_once_then_sent_once(
    priya_short: ParleyClient,
    marco_short: ParleyClient,
    northwind: httpx.AsyncClient,
    sessions: Database,
    temporal_client: Client,
) -> None:
    client = priya_short
    before = {
        "expired": counted(OUTCOMES, outcome="expired"),
        "confirmed": counted(OUTCOMES, outcome="confirmed"),
        "renewals": counted("parley_confirmation_renewals_total"),
        "warnings": counted("parley_confirmation_warnings_total"),
    }
    sid = await client.new_session()
    turn_id, events, card = await propose(client, sid)
    aid = card["id"]
    # The card says when it lapses, in the stream and in the session read alike.
    expires_at = datetime.fromisoformat(card["expires_at"])
    assert (await client.session_view(sid))["pending_action"]["expires_at"] == card["expires_at"]

    # The warning: written once by the sweep, before the card lapses.
    await eventually(lambda: warned(sessions), timeout=WINDOW_S, what="the expiry warning")
    assert await warned(sessions) == 0  # once per card
    await view_state(client, sid, turn_id, "expired", timeout=WINDOW_S + 15)
    after_card = events[-1].id or 0
    rest = await client.events(sid, turn_id, last_event_id=after_card)
    kinds = types(rest)
    assert kinds.count("confirmation_expiring") == 1
    assert kinds.index("confirmation_expiring") < kinds.index("confirmation_resolved")
    [warning] = [e for e in rest if e.type == "confirmation_expiring"]
    assert warning.data["action"]["id"] == aid
    assert warning.data["action"]["expires_at"] == card["expires_at"]
    [lapsed] = [e.data["action"] for e in rest if e.type == "confirmation_resolved"]
    assert lapsed["status"] == "expired"
    calls_before = await model_calls(sessions, turn_id)

    # Another user's renew is 404, and changes nothing.
    stranger = await marco_short.http.post(renew_url(sid, aid))
    assert stranger.status_code == 404 and code(stranger) == "not_found"

    renewed = await client.http.post(renew_url(sid, aid))
    assert renewed.status_code == 202, renewed.text
    new = renewed.json()["action"]
    assert new["id"] != aid and new["renewed_from"] == aid
    assert (new["args_hash"], new["tool"], new["summary"]) == (
        card["args_hash"],
        card["tool"],
        card["summary"],
    )
    assert new["status"] == "pending"
    assert datetime.fromisoformat(new["expires_at"]) > expires_at
    again = await client.http.post(renew_url(sid, aid))  # a double click: the same card
    assert again.status_code == 202 and again.json()["action"]["id"] == new["id"]
    still_pending = await client.http.post(renew_url(sid, new["id"]))
    assert still_pending.status_code == 409 and code(still_pending) == "action_not_expired"
    view = await client.session_view(sid)
    assert view["pending_action"]["id"] == new["id"]

    # One confirm sends once, under the renewal's key; the expired card sent nothing.
    confirmed = await client.http.post(renew_url(sid, new["id"], "confirm"))
    assert confirmed.status_code == 202, confirmed.text
    repeated = await client.http.post(renew_url(sid, new["id"], "confirm"))
    assert repeated.status_code == 409 and code(repeated) == "action_resolved"

    async def sent() -> list[object]:
        return await emails(northwind, action_id=new["id"])

    [email] = await eventually(sent, timeout=20, what="the renewed card's email")
    assert email["to"] == "priya@example.com"  # type: ignore[index]

    async def executed() -> bool:
        async with connect(sessions) as conn:
            row = await actions.get_action(conn, action_id=new["id"])
        return row is not None and row.status == ActionStatus.executed

    await eventually(executed, timeout=20, what="the renewed card executed")
    # The renewal's own workflow took the confirm (an Update), not its window's end.
    waited = temporal_client.get_workflow_handle(renewal_workflow_id(action_id=new["id"]))
    await waited.result()
    history = await waited.fetch_history()
    steps = [
        e.activity_task_scheduled_event_attributes.activity_type.name
        for e in history.events
        if e.HasField("activity_task_scheduled_event_attributes")
    ]
    assert steps == ["send_email"]
    assert any(
        e.HasField("workflow_execution_update_accepted_event_attributes") for e in history.events
    )
    await replayer(RenewalWorkflow).replay_workflow(history)
    assert len(await sent()) == 1
    assert await emails(northwind, action_id=aid) == []
    # No model was asked again: the renewal is the stored proposal, shown anew.
    assert await model_calls(sessions, turn_id) == calls_before
    shown = await client.events(sid, turn_id, last_event_id=rest[-1].id)
    assert [e.data["action"]["id"] for e in shown if e.type == "confirmation_required"] == [
        new["id"]
    ]
    assert [e.data["action"]["status"] for e in shown if e.type == "confirmation_resolved"] == [
        "confirmed"
    ]
    assert ("tool", "end") in [(e.type, e.data.get("phase")) for e in shown]
    # The session no longer shows a card, and the turn stays as it ended.
    view = await client.session_view(sid)
    assert view["pending_action"] is None
    assert (await client.turn_view(sid, turn_id))["state"] == "expired"
    # Each outcome counted apart (tests of this process run one at a time: at least these).
    assert counted(OUTCOMES, outcome="expired") >= before["expired"] + 1
    assert counted(OUTCOMES, outcome="confirmed") >= before["confirmed"] + 1
    assert counted("parley_confirmation_renewals_total") == before["renewals"] + 1
    assert counted("parley_confirmation_warnings_total") >= before["warnings"] + 1


async def test_a_card_renewed_before_its_turn_has_ended_outlives_the_turn(
    priya_short: ParleyClient,
    priya: ParleyClient,
    northwind: httpx.AsyncClient,
    sessions: Database,
) -> None:
    """The card's window closes (`expires_at`) a moment before the turn's timer ends the
    turn; a renew in that gap makes a card the turn's ending must leave alone. (Renewed
    through the session's API, whose window is the default: it outlasts the turn's.)"""
    client = priya_short
    sid = await client.new_session()
    turn_id, _, card = await propose(client, sid)
    async with orm(sessions) as db:  # widen the gap deterministically: the window has passed
        past = datetime.now(UTC) - timedelta(seconds=1)
        await db.execute(update(Action).where(Action.id == card["id"]).values(expires_at=past))
        await db.commit()
    renewed = await priya.http.post(renew_url(sid, card["id"]))
    assert renewed.status_code == 202, renewed.text
    new = renewed.json()["action"]
    assert (await client.turn_view(sid, turn_id))["state"] == "awaiting_confirmation"

    await view_state(client, sid, turn_id, "expired", timeout=WINDOW_S + 15)
    assert (await client.session_view(sid))["pending_action"]["id"] == new["id"]
    confirmed = await client.http.post(renew_url(sid, new["id"], "confirm"))
    assert confirmed.status_code == 202, confirmed.text

    async def sent() -> list[object]:
        return await emails(northwind, action_id=new["id"])

    await eventually(sent, timeout=20, what="the renewed card's email")
    assert await emails(northwind, action_id=card["id"]) == []


# --- who may renew ---------------------------------------------------------------------------


@pytest_asyncio.fixture
async def fay(api_url: str, sessions: Database) -> AsyncIterator[tuple[ParleyClient, Identity]]:
    """A customer of their own, whose access the test changes."""
    user_id = f"cust_a{uuid.uuid4().hex[:8]}"
    async with orm(sessions) as db:
        await db.execute(insert(User).values(tenant_id="northwind", id=user_id, display_name="Fay"))
        await db.commit()
    async with sessions() as db:
        token = await create_token(db, tenant_id="northwind", user_id=user_id)
        await db.commit()
    client = ParleyClient(api_url, token)
    yield client, Identity(tenant_id="northwind", user_id=user_id, roles=())
    await client.aclose()


async def _expired_card(sessions: Database, owner: Identity) -> actions.ActionRow:
    """A card of `owner`'s whose window has passed (no workflow waits for it)."""
    async with sessions() as db:
        posted = await post_unstarted(db, owner=owner, text="Can you email me?")
    async with connect(sessions) as conn:
        turn = await turn_facts(conn, turn_id=posted.turn.id)
        assert turn is not None
        return await actions.create_action(
            conn,
            turn=turn,
            action_id=f"act_{uuid.uuid4().hex[:12]}",
            tool="send_email",
            args={"to": "fay@example.com", "subject": "Your order", "body": "On its way."},
            summary="Email the status of your order",
            recipient_masked="f***@example.com",
            ttl=timedelta(seconds=-1),
        )


async def _set_assistant(sessions: Database, owner: Identity, *, enabled: bool) -> None:
    async with sessions() as db:
        await set_feature(
            db,
            tenant_id=owner.tenant_id,
            user_id=owner.user_id,
            feature=ASSISTANT,
            enabled=enabled,
        )
        await db.commit()


async def test_renew_checks_the_user_as_they_are_now(
    fay: tuple[ParleyClient, Identity], sessions: Database
) -> None:
    client, owner = fay
    card = await _expired_card(sessions, owner)
    await _set_assistant(sessions, owner, enabled=False)
    refused = await client.http.post(renew_url(card.session_id, card.id))
    assert refused.status_code == 403 and code(refused) == "feature_not_enabled"
    async with connect(sessions) as conn:  # refused before anything was written
        stored = await actions.get_action(conn, action_id=card.id)
        assert stored is not None and stored.status == ActionStatus.pending
        assert (
            await actions.get_action(conn, action_id=renewal_action_id(action_id=card.id)) is None
        )

    await _set_assistant(sessions, owner, enabled=True)
    renewed = await client.http.post(renew_url(card.session_id, card.id))
    assert renewed.status_code == 202, renewed.text
    assert renewed.json()["action"]["renewed_from"] == card.id
    # An erasure of the session finds the renewal's workflow by its turn.
    async with connect(sessions) as conn:
        found = await approvals.renewals_of(conn, turn_ids=[card.turn_id])
    assert found == {card.turn_id: [renewed.json()["action"]["id"]]}
    # Nobody answers the renewal here: decline it, so its wait ends now.
    declined = await client.http.post(
        renew_url(card.session_id, renewed.json()["action"]["id"], "decline")
    )
    assert declined.status_code == 202, declined.text


async def test_the_tenants_lead_time_decides_when_its_cards_warn(sessions: Database) -> None:
    # A tenant of the test's own: its setting over a deployment default that warns nobody.
    tenant = await new_admin_tenant(sessions, prefix="warn")
    owner = Identity(tenant_id=tenant.tenant_id, user_id=tenant.admin_id, roles=())
    async with sessions() as db:
        posted = await post_unstarted(db, owner=owner, text="Can you email me?")
    async with connect(sessions) as conn:
        turn = await turn_facts(conn, turn_id=posted.turn.id)
        assert turn is not None
        card = await actions.create_action(
            conn,
            turn=turn,
            action_id=f"act_{uuid.uuid4().hex[:12]}",
            tool="send_email",
            args={"to": "ops@example.com", "subject": "S", "body": "B"},
            summary="Email the status of your order",
            recipient_masked="o***@example.com",
            ttl=timedelta(minutes=5),
        )
    async with sessions() as db:
        assert await approvals.warn_expiring(db, default_lead_s=0) == []
        await tenants.set_config(
            db, tenant_id=tenant.tenant_id, config=TenantConfig(confirmation_warning_s=600.0)
        )
        warned_now = await approvals.warn_expiring(db, default_lead_s=0)
        await db.commit()
    assert [a.id for a in warned_now] == [card.id]
    async with sessions() as db:
        assert await approvals.warn_expiring(db, default_lead_s=0) == []


async def test_a_renewal_whose_card_was_erased_meanwhile_ends_with_nothing_to_send(
    sessions: Database,
) -> None:
    # The renewal's wait outlives an erasure of its session: its timer's step finds no card.
    send = SendActivities(sessions=sessions, northwind=None)  # type: ignore[arg-type]
    gone = await send.expire_action(ActionInput("trn_gone", f"act_{uuid.uuid4().hex[:12]}"))
    assert gone.status == ActionStatus.expired
