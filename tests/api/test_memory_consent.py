"""Durable, consented memory (issue 11, acceptance 3) through the public API, with the real
PostgreSQL and Temporal: nothing is stored without consent; a stated preference comes back in
the next session as a hint labelled unverified; an expired item is never used; consent off
deletes every item and every derived copy; one key can be deleted; a hint never overrides a
tool result. The pure rules (which words state a preference) are tested at the end."""

from __future__ import annotations

import re
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from sqlalchemy import func, select, update

from parley.activities.memory import MemoryActivities
from parley.config import Settings
from parley.consented import HINTS_PREFIX, Remembered, stated_preferences
from parley.contracts import SummarizeInput
from parley.gateway.demo import DemoModel
from parley.gateway.registry import ProviderPool
from parley.store import user_memory
from parley.store.db import Database
from parley.store.models import (
    ChatSession,
    ConversationSummary,
    Message,
    ModelCall,
    PinnedFactRow,
    Turn,
    UserMemoryItem,
)
from tests.support.client import ParleyClient
from tests.support.orm import orm
from tests.support.toolkit import model_calls, reply

PRIYA = {"tenant_id": "northwind", "user_id": "cust_2291"}
CONTACT_QUESTION = "How should you contact me?"


@pytest_asyncio.fixture
async def me(priya: ParleyClient) -> AsyncIterator[ParleyClient]:
    """Priya with memory off and empty before and after (other tests share her)."""
    await set_consent(priya, False)
    yield priya
    await set_consent(priya, False)


async def set_consent(client: ParleyClient, consent: bool) -> dict[str, Any]:
    response = await client.http.put("/v1/memory/consent", json={"consent": consent})
    assert response.status_code == 200, response.text
    return dict(response.json())


async def memory(client: ParleyClient) -> dict[str, Any]:
    response = await client.http.get("/v1/memory")
    assert response.status_code == 200, response.text
    return dict(response.json())


async def requests_of(sessions: Database, turn_id: str) -> list[dict[str, Any]]:
    calls = await model_calls(sessions, turn_id)
    return [c.request for c in calls if c.provider != "resolver"]


def hint_messages(request: dict[str, Any]) -> list[str]:
    return [
        str(m["content"])
        for m in request["messages"]
        if isinstance(m.get("content"), str) and m["content"].startswith(HINTS_PREFIX)
    ]


async def state_preference(client: ParleyClient, text: str) -> tuple[str, str]:
    """Post a statement in a new session; (session id, message id) once its turn is done."""
    sid = await client.new_session()
    response = await client.post(sid, text)
    assert response.status_code == 202, response.text
    body = response.json()
    events = await client.events(sid, body["turn_id"])
    assert events[-1].type == "done"
    return sid, str(body["message"]["id"])


async def test_nothing_is_remembered_without_consent(me: ParleyClient, sessions: Database) -> None:
    assert await memory(me) == {"consent": False, "items": []}
    sid, _ = await state_preference(me, "Email is the best way to reach me.")
    assert await memory(me) == {"consent": False, "items": []}
    async with orm(sessions) as db:
        stored = await db.scalar(
            select(func.count()).select_from(UserMemoryItem).filter_by(**PRIYA)
        )
        copies = await db.scalar(
            select(func.count())
            .select_from(PinnedFactRow)
            .where(PinnedFactRow.session_id == sid, PinnedFactRow.memory_key.is_not(None))
        )
    assert stored == 0 and copies == 0
    # And nothing reaches the next session's prompt.
    other = await me.new_session()
    turn_id, events = await me.turn(other, CONTACT_QUESTION)
    assert "don't have a saved preference" in reply(events)
    assert hint_messages((await requests_of(sessions, turn_id))[0]) == []


async def test_a_stated_preference_is_remembered_and_hinted_in_the_next_session(
    me: ParleyClient, sessions: Database, settings: Settings
) -> None:
    assert (await set_consent(me, True))["consent"] is True
    first, message_id = await state_preference(me, "Please contact me by phone.")

    view = await memory(me)
    assert view["consent"] is True
    [item] = view["items"]
    assert (item["key"], item["value"], item["source"]) == (
        "contact_channel",
        "phone",
        f"message:{message_id}",
    )
    assert item["expires_at"] > item["created_at"]

    async with orm(sessions) as db:
        shown_where_stated = await db.scalars(
            select(ModelCall.request["budget"]["memory_hints"])
            .join(Turn, Turn.id == ModelCall.turn_id)
            .where(Turn.session_id == first)
        )
        # Where it was said it is a pinned fact (the user's words), not a "last time" hint.
        assert list(shown_where_stated) == [[]]
        pinned = await db.get(PinnedFactRow, (first, "contact_channel"))
        assert pinned is not None and pinned.value == "phone"

    second = await me.new_session()
    turn_id, events = await me.turn(second, CONTACT_QUESTION)
    answer = reply(events)
    assert "Last time you told us you preferred phone" in answer and "not verified" in answer
    request = (await requests_of(sessions, turn_id))[0]
    [hints] = hint_messages(request)
    assert "last time you preferred phone" in hints and "UNVERIFIED" in hints
    assert request["budget"]["memory_hints"] == ["contact_channel"]
    # The hint sits before the conversation and the state block, never among the facts.
    contents = [str(m.get("content")) for m in request["messages"]]
    state_at = next(i for i, c in enumerate(contents) if c.startswith("Conversation state"))
    assert contents.index(hints) < state_at
    assert "phone" not in contents[state_at]

    # Deleting the one key: 204, gone from the API, from the session's copy and the prompt.
    response = await me.http.delete("/v1/memory/contact_channel")
    assert response.status_code == 204, response.text
    assert await memory(me) == {"consent": True, "items": []}
    async with orm(sessions) as db:
        copy = await db.get(PinnedFactRow, (first, "contact_channel"))
    assert copy is None
    turn_id, events = await me.turn(second, CONTACT_QUESTION)
    assert "don't have a saved preference" in reply(events)
    assert hint_messages((await requests_of(sessions, turn_id))[0]) == []

    missing = await me.http.delete("/v1/memory/contact_channel")
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "not_found"


async def test_an_expired_item_is_never_used(me: ParleyClient, sessions: Database) -> None:
    await set_consent(me, True)
    await state_preference(me, "I prefer email.")
    assert [i["value"] for i in (await memory(me))["items"]] == ["email"]

    async with orm(sessions) as db:
        await db.execute(
            update(UserMemoryItem)
            .filter_by(**PRIYA, key="contact_channel")
            .values(expires_at=func.now() - func.make_interval(0, 0, 0, 1))
        )
        await db.commit()

    assert await memory(me) == {"consent": True, "items": []}
    sid = await me.new_session()
    turn_id, events = await me.turn(sid, CONTACT_QUESTION)
    assert "don't have a saved preference" in reply(events)
    request = (await requests_of(sessions, turn_id))[0]
    assert hint_messages(request) == [] and request["budget"]["memory_hints"] == []


async def test_consent_off_deletes_every_item_and_every_derived_copy(
    me: ParleyClient, sessions: Database, settings: Settings
) -> None:
    plain = await me.new_session()  # a session whose turns never saw a hint
    await me.turn(plain, "Thanks!")
    await set_consent(me, True)
    stated_in, _ = await state_preference(me, "Email is the best way to reach me.")
    # A later session is shown the hint, and its summary folds that turn in.
    hinted = await me.new_session()
    _, events = await me.turn(hinted, CONTACT_QUESTION)
    assert "preferred email" in reply(events)
    for sid in (hinted, plain):
        await pad_history(sessions, sid, exchanges=10)
        await summarize(sessions, settings, sid)
    async with orm(sessions) as db:
        folded = {
            s.session_id: s.memory_keys
            for s in await db.scalars(
                select(ConversationSummary).where(
                    ConversationSummary.session_id.in_([hinted, plain])
                )
            )
        }
        copy = await db.get(PinnedFactRow, (stated_in, "contact_channel"))
    assert folded == {hinted: ["contact_channel"], plain: []}
    assert copy is not None and copy.memory_key == "contact_channel"

    assert await set_consent(me, False) == {"consent": False, "items": []}
    assert await memory(me) == {"consent": False, "items": []}
    async with orm(sessions) as db:
        items = await db.scalar(select(func.count()).select_from(UserMemoryItem).filter_by(**PRIYA))
        copies = await db.scalar(
            select(func.count())
            .select_from(PinnedFactRow)
            .join(ChatSession, ChatSession.id == PinnedFactRow.session_id)
            .where(ChatSession.user_id == PRIYA["user_id"], PinnedFactRow.memory_key.is_not(None))
        )
        left = set(
            await db.scalars(
                select(ConversationSummary.session_id).where(
                    ConversationSummary.session_id.in_([hinted, plain])
                )
            )
        )
    assert items == 0 and copies == 0
    assert left == {plain}  # the summary made from memory is gone; the other one stays
    # A new statement is not remembered now that consent is off.
    await state_preference(me, "Please contact me by phone.")
    assert await memory(me) == {"consent": False, "items": []}


async def test_a_hint_never_overrides_a_tool_result(me: ParleyClient, sessions: Database) -> None:
    await set_consent(me, True)
    async with sessions() as db:
        # An item that is out of date: the order has shipped, it has not arrived.
        await user_memory.remember(
            db,
            **PRIYA,
            remembered=[Remembered("order_8472_status", "delivered on Oct 2", "message:old")],
            ttl_days=30,
        )
        await db.commit()
    sid = await me.new_session()
    turn_id, events = await me.turn(sid, "Where is my order 8472?")
    answer = reply(events)
    request = (await requests_of(sessions, turn_id))[-1]
    [hints] = hint_messages(request)
    assert "order 8472 status: delivered on Oct 2" in hints
    assert any(m["role"] == "tool" for m in request["messages"])
    assert "Your order 8472 has shipped" in answer
    assert "arrived" not in answer and "delivered" not in answer
    assert not re.search(r"\bOct 2\b", answer)  # the hint's date (Oct 26 is the tool's)


async def test_a_confirmed_email_proposal_is_remembered_as_the_contact_channel(
    me: ParleyClient,
) -> None:
    await set_consent(me, True)
    sid = await me.new_session()
    await me.turn(sid, "Where is my order?")
    posted = await me.post(sid, "Can you email me?")
    assert posted.status_code == 202, posted.text
    turn_id = posted.json()["turn_id"]
    events = await me.events(sid, turn_id)
    assert events[-1].type == "confirmation_required"
    action_id = events[-1].data["action"]["id"]
    assert await memory(me) == {"consent": True, "items": []}  # proposed is not chosen

    confirmed = await me.http.post(f"/v1/sessions/{sid}/actions/{action_id}/confirm")
    assert confirmed.status_code == 202, confirmed.text
    rest = await me.events(sid, turn_id, last_event_id=events[-1].id)
    assert rest[-1].type == "done"
    [item] = (await memory(me))["items"]
    assert (item["key"], item["value"], item["source"]) == (
        "contact_channel",
        "email",
        f"action:{action_id}",
    )


# --- helpers for the summary -----------------------------------------------------------------


async def pad_history(sessions: Database, session_id: str, *, exchanges: int) -> None:
    """Later messages, so the first turns leave the window and a summary folds them in."""
    async with orm(sessions) as db:
        session = await db.get(ChatSession, session_id, with_for_update=True)
        assert session is not None
        seq = session.last_seq
        for n in range(exchanges):
            for role, text in (
                ("user", f"Question {n} about order 8472 and when it might arrive."),
                ("assistant", f"Answer {n}: a few words about the order, to be folded in."),
            ):
                seq += 1
                db.add(
                    Message(
                        id=f"msg_{uuid.uuid4().hex[:20]}",
                        session_id=session_id,
                        seq=seq,
                        role=role,
                        status="complete",
                        text=text,
                    )
                )
        session.last_seq = seq
        await db.commit()


async def summarize(sessions: Database, settings: Settings, session_id: str) -> None:
    tight = settings.model_copy(
        update={"context_conversation_tokens": 300, "summary_min_new_tokens": 1}
    )
    activities = MemoryActivities(
        sessions=sessions,
        providers=ProviderPool(tight, primary=DemoModel(token_delay_s=0)),
        settings=tight,
    )
    result = await activities.summarize(SummarizeInput(session_id, "trn_padded"))
    assert result.summarized and result.through_seq >= 2


# --- the pure rule: which words state a preference ------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Email is the best way to reach me.", "email"),
        ("please contact me by phone", "phone"),
        ("I'd prefer to be contacted by text messages", "sms"),
        ("Hi! Where is my order? Also, reach me via e-mail.", "email"),
        ("Do not contact me by phone.", None),
        ("Is email the best way to reach you?", None),
        ("The assistant said email is fine.", None),
    ],
)
def test_only_an_explicit_statement_is_a_preference(text: str, expected: str | None) -> None:
    found = stated_preferences(text, message_id="msg_x")
    assert [p.value for p in found] == ([expected] if expected else [])
    assert all(p.source == "message:msg_x" for p in found)
