"""Versions of a conversation through the public API (issue 42, acceptance 1-3): an edit and
a regenerate open a branch, a switch brings the other back, memory follows the branch shown,
and a side effect stays a fact on every branch. The prompt a provider receives is the request
its model call stored (tests/support/toolkit.py `model_calls`)."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import httpx

from parley.prompt import ELSEWHERE_PREFIX
from parley.store.db import Database
from parley.store.lifecycle import exports
from tests.support.client import ParleyClient
from tests.support.sse import Event
from tests.support.toolkit import emails, model_calls, propose, types


async def edit(client: ParleyClient, sid: str, message_id: str, text: str) -> httpx.Response:
    body = {"client_message_id": uuid.uuid4().hex, "text": text}
    return await client.http.post(f"/v1/sessions/{sid}/messages/{message_id}/edit", json=body)


async def switch(client: ParleyClient, sid: str, message_id: str, version: int) -> httpx.Response:
    return await client.http.post(f"/v1/sessions/{sid}/messages/{message_id}/versions/{version}")


async def listing(client: ParleyClient, sid: str) -> dict[str, Any]:
    found = await client.http.get(f"/v1/sessions/{sid}/messages")
    assert found.status_code == 200, found.text
    return dict(found.json())


async def answered(client: ParleyClient, sid: str, started: httpx.Response) -> str:
    """The started turn's id, once it is done."""
    assert started.status_code == 202, started.text
    turn_id = str(started.json()["turn_id"])
    events = await client.events(sid, turn_id)
    assert events[-1].type == "done", types(events)
    return turn_id


async def first_prompt(sessions: Database, turn_id: str) -> str:
    calls = [c for c in await model_calls(sessions, turn_id) if c.provider != "resolver"]
    return "\n".join(str(m.get("content")) for m in calls[0].request["messages"])


async def rest(client: ParleyClient, sid: str, turn_id: str, after: int) -> list[Event]:
    """The rest of a resting turn's stream, once its card is answered (bounded)."""
    return await asyncio.wait_for(client.events(sid, turn_id, last_event_id=after), 30)


def user_message(shown: dict[str, Any], text: str) -> dict[str, Any]:
    return next(m for m in shown["messages"] if m["role"] == "user" and m["text"] == text)


# --- acceptance 1: edit ------------------------------------------------------------------------


async def test_an_edit_branches_and_the_next_prompt_follows_the_version_shown(
    priya: ParleyClient, sessions: Database
) -> None:
    sid = await priya.new_session()
    await priya.turn(sid, "Hello there")
    await priya.turn(sid, "Please call me Sam")
    await priya.turn(sid, "Where is my order?")
    sam = user_message(await listing(priya, sid), "Please call me Sam")

    edited = await edit(priya, sid, sam["id"], "Please call me Alex")
    await answered(priya, sid, edited)
    alex = edited.json()["message"]
    shown = await listing(priya, sid)
    texts = [m["text"] for m in shown["messages"] if m["role"] == "user"]
    assert texts == ["Hello there", "Please call me Alex"]  # the rest stays on its branch
    assert user_message(shown, "Please call me Alex")["versions"] == {"count": 2, "shown": 2}

    on_alex = await answered(priya, sid, await priya.post(sid, "What is my name?"))
    prompt = await first_prompt(sessions, on_alex)
    assert "Alex" in prompt and "Sam" not in prompt, prompt

    switched = await switch(priya, sid, alex["id"], 1)
    assert switched.status_code == 200, switched.text
    assert switched.json()["versions"] == {"count": 2, "shown": 1}
    shown = await listing(priya, sid)
    texts = [m["text"] for m in shown["messages"] if m["role"] == "user"]
    assert texts == ["Hello there", "Please call me Sam", "Where is my order?"]
    assert user_message(shown, "Please call me Sam")["versions"] == {"count": 2, "shown": 1}

    on_sam = await answered(priya, sid, await priya.post(sid, "And what is my name?"))
    prompt = await first_prompt(sessions, on_sam)
    assert "Sam" in prompt and "Alex" not in prompt, prompt

    # Back to the edit: its continuation is there again.
    assert (await switch(priya, sid, sam["id"], 2)).status_code == 200
    shown = await listing(priya, sid)
    texts = [m["text"] for m in shown["messages"] if m["role"] == "user"]
    assert texts == ["Hello there", "Please call me Alex", "What is my name?"]

    # Its last answer written again, then away and back: the version comes back as it was
    # shown last, with the regenerated answer.
    again = await priya.http.post(f"/v1/sessions/{sid}/turns/{on_alex}/regenerate")
    regenerated = await answered(priya, sid, again)
    assert (await switch(priya, sid, alex["id"], 1)).status_code == 200
    assert (await switch(priya, sid, sam["id"], 2)).status_code == 200
    last = (await listing(priya, sid))["messages"][-1]
    assert last["turn_id"] == regenerated and last["versions"] == {"count": 2, "shown": 2}


async def test_what_cannot_be_edited_or_switched_is_refused_in_the_contracts_shape(
    priya: ParleyClient, marco: ParleyClient
) -> None:
    sid = await priya.new_session()
    await priya.turn(sid, "Where is my order?")
    shown = await listing(priya, sid)
    asked = user_message(shown, "Where is my order?")
    answer = shown["messages"][-1]
    assert answer["role"] == "assistant" and "versions" not in answer

    not_mine = await edit(marco, sid, asked["id"], "Hi")
    assert not_mine.status_code == 404 and not_mine.json()["error"]["code"] == "not_found"
    not_a_user_message = await edit(priya, sid, answer["id"], "Hi")
    assert not_a_user_message.status_code == 404
    empty = await priya.http.post(
        f"/v1/sessions/{sid}/messages/{asked['id']}/edit",
        json={"client_message_id": "k", "text": ""},
    )
    assert empty.status_code == 422 and empty.json()["error"]["code"] == "invalid_request"
    no_such_version = await switch(priya, sid, asked["id"], 2)
    assert no_such_version.status_code == 404
    same_version = await switch(priya, sid, asked["id"], 1)  # shown already: nothing changes
    assert same_version.status_code == 200
    assert same_version.json()["versions"] == {"count": 1, "shown": 1}

    key = uuid.uuid4().hex
    body = {"client_message_id": key, "text": "Where is my order 8472?"}
    url = f"/v1/sessions/{sid}/messages/{asked['id']}/edit"
    first = await priya.http.post(url, json=body)
    assert first.status_code == 202, first.text
    again = await priya.http.post(url, json=body)  # the same edit again: its turn, nothing new
    assert again.status_code == 200 and again.json()["turn_id"] == first.json()["turn_id"]
    other = await priya.http.post(url, json={**body, "text": "Something else"})
    assert other.status_code == 422 and other.json()["error"]["code"] == "idempotency_key_reused"
    while_running = await switch(priya, sid, first.json()["message"]["id"], 1)
    if while_running.status_code != 200:  # the edit's turn may have ended already
        assert while_running.json()["error"]["code"] == "turn_in_progress"
    await priya.events(sid, first.json()["turn_id"])


# --- acceptance 2: regenerate ------------------------------------------------------------------


async def test_three_regenerates_make_four_versions_from_the_same_history(
    priya: ParleyClient, sessions: Database
) -> None:
    sid = await priya.new_session()
    first, _ = await priya.turn(sid, "Where is my order?")
    turns = [first]
    for _ in range(3):
        regenerated = await priya.http.post(f"/v1/sessions/{sid}/turns/{turns[-1]}/regenerate")
        turns.append(await answered(priya, sid, regenerated))
    assert len(set(turns)) == 4

    shown = await listing(priya, sid)
    answers = [m for m in shown["messages"] if m["role"] == "assistant" and m.get("versions")]
    assert len(answers) == 1 and answers[0]["versions"] == {"count": 4, "shown": 4}
    assert answers[0]["turn_id"] == turns[-1]
    assert [m["text"] for m in shown["messages"] if m["role"] == "user"] == ["Where is my order?"]

    # The provider's first call of each of the four turns saw the same conversation.
    histories = []
    for turn_id in turns:
        calls = [c for c in await model_calls(sessions, turn_id) if c.provider != "resolver"]
        histories.append([m for m in calls[0].request["messages"] if m["role"] != "system"])
    assert all(history == histories[0] for history in histories), histories

    # Any version is one call away, and so are the others from there.
    assert (await switch(priya, sid, answers[0]["id"], 2)).status_code == 200
    shown = await listing(priya, sid)
    answer = next(m for m in shown["messages"] if m.get("versions"))
    assert answer["turn_id"] == turns[1] and answer["versions"] == {"count": 4, "shown": 2}

    finished_only = await priya.post(sid, "Thanks!")
    running = str(finished_only.json()["turn_id"])
    again = await priya.http.post(f"/v1/sessions/{sid}/turns/{running}/regenerate")
    if again.status_code != 202:  # refused while it runs; once done, it would branch
        assert again.status_code == 409, again.text
    else:
        await priya.events(sid, again.json()["turn_id"])
    await priya.events(sid, running)


# --- acceptance 3: side effects are facts ------------------------------------------------------


async def test_an_email_sent_on_one_branch_is_a_fact_on_the_other_and_a_left_card_is_superseded(
    priya: ParleyClient, northwind: httpx.AsyncClient, sessions: Database
) -> None:
    sid = await priya.new_session()
    turn_id, events, action = await propose(priya, sid)
    aid = action["id"]
    confirmed = await priya.http.post(f"/v1/sessions/{sid}/actions/{aid}/confirm")
    assert confirmed.status_code == 202, confirmed.text
    after = await rest(priya, sid, turn_id, events[-1].id or 0)
    assert after[-1].type == "done", types(after)
    assert len(await emails(northwind, action_id=aid)) == 1

    # An edit above the email: branch B, where the email is not in the conversation shown.
    asked = user_message(await listing(priya, sid), "Where is my order?")
    await answered(priya, sid, await edit(priya, sid, asked["id"], "Where is my order, please?"))
    shown = await listing(priya, sid)
    assert [e["action_id"] for e in shown["elsewhere"]] == [aid]
    assert shown["elsewhere"][0]["status"] == "executed"
    assert not any(m.get("text") == "Can you email me?" for m in shown["messages"])

    # The model is told, and nothing is sent again.
    posted = await priya.post(sid, "Can you email me?")
    assert posted.status_code == 202, posted.text
    on_b = str(posted.json()["turn_id"])
    rested = await priya.events(sid, on_b)
    prompt = await first_prompt(sessions, on_b)
    assert ELSEWHERE_PREFIX.strip() in prompt and aid in prompt, prompt
    assert len(await emails(northwind, action_id=aid)) == 1

    # A card pending on B, then a switch back to A: the card is superseded and sends nothing.
    assert rested[-1].type == "confirmation_required", types(rested)
    card = rested[-1].data["action"]["id"]
    edited = user_message(await listing(priya, sid), "Where is my order, please?")
    assert (await switch(priya, sid, edited["id"], 1)).status_code == 200
    late = await priya.http.post(f"/v1/sessions/{sid}/actions/{card}/confirm")
    assert late.status_code == 409 and late.json()["error"]["code"] == "action_superseded"
    closed = await rest(priya, sid, on_b, rested[-1].id or 0)
    assert closed[-1].type == "done", types(closed)
    assert await emails(northwind, action_id=card) == []
    assert len(await emails(northwind, action_id=aid)) == 1
    shown = await listing(priya, sid)
    assert shown["elsewhere"] == []  # back on A, the email is in the conversation itself
    assert any(m.get("text") == "Can you email me?" for m in shown["messages"])


# --- every branch: forget one message, export ------------------------------------------------


async def test_a_forgotten_message_is_gone_from_every_branch_and_the_export_holds_them_all(
    priya: ParleyClient, sessions: Database
) -> None:
    sid = await priya.new_session()
    await priya.turn(sid, "Please call me Sam")
    await priya.turn(sid, "Where is my order?")
    sam = user_message(await listing(priya, sid), "Please call me Sam")
    edited = await edit(priya, sid, sam["id"], "Please call me Alex")
    await answered(priya, sid, edited)

    async with sessions() as db:  # the export: both versions, each with its branch
        archived = await exports.session_content(db, session_id=sid)
    shown = {m["text"]: m for m in archived.messages if m["role"] == "user"}
    assert shown["Please call me Sam"]["off_path"] and not shown["Please call me Alex"]["off_path"]
    assert shown["Please call me Sam"]["branch"] != shown["Please call me Alex"]["branch"]

    # Forgotten while another version is shown: gone from the branch it was on too.
    forgotten = await priya.http.delete(f"/v1/sessions/{sid}/messages/{sam['id']}")
    assert forgotten.status_code == 200, forgotten.text
    alex = edited.json()["message"]["id"]
    assert (await switch(priya, sid, alex, 1)).status_code == 200
    texts = [m["text"] for m in (await listing(priya, sid))["messages"]]
    assert texts[0] == "Where is my order?" and not any("Sam" in t for t in texts), texts
    on_first = await answered(priya, sid, await priya.post(sid, "What is my name?"))
    prompt = await first_prompt(sessions, on_first)
    assert "Sam" not in prompt and "Alex" not in prompt, prompt
    async with sessions() as db:
        saved = await db.values(
            "SELECT CAST(saved AS text) FROM branches WHERE session_id = %(sid)s", {"sid": sid}
        )
    assert saved and not any("Sam" in str(s) for s in saved), saved


async def test_regenerating_an_answer_that_sent_an_email_sends_nothing_again(
    priya: ParleyClient, northwind: httpx.AsyncClient, sessions: Database
) -> None:
    sid = await priya.new_session()
    turn_id, events, action = await propose(priya, sid)
    aid = action["id"]
    confirmed = await priya.http.post(f"/v1/sessions/{sid}/actions/{aid}/confirm")
    assert confirmed.status_code == 202, confirmed.text
    assert (await rest(priya, sid, turn_id, events[-1].id or 0))[-1].type == "done"

    again = await priya.http.post(f"/v1/sessions/{sid}/turns/{turn_id}/regenerate")
    assert again.status_code == 202, again.text
    regenerated = str(again.json()["turn_id"])
    rested = await priya.events(sid, regenerated)
    prompt = await first_prompt(sessions, regenerated)
    assert ELSEWHERE_PREFIX.strip() in prompt and aid in prompt, prompt
    shown = await listing(priya, sid)
    assert [e["action_id"] for e in shown["elsewhere"]] == [aid]
    if rested[-1].type == "confirmation_required":  # offered again: a new card, not sent
        card = rested[-1].data["action"]["id"]
        assert card != aid
        assert await emails(northwind, action_id=card) == []
    assert len(await emails(northwind, action_id=aid)) == 1
