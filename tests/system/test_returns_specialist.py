"""The returns conversation of design.md's third example, end to end through the public API:
the turn hands the return to the Returns specialist (a child workflow), which asks which item
and why (`interaction`s the user answers by option value or in words, delivered to the waiting
specialist rather than starting turns), checks the window and proposes `create_return`, which
only the user's confirm executes, once. A specialist left waiting ends the turn politely.

The backend is this module's own, so its `GET /returns` holds only these returns."""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest_asyncio
from temporalio.client import Client, WorkflowExecutionStatus

from parley.config import Settings
from parley.demo_backend.app import create_app as create_backend
from parley.gateway.demo import DemoModel
from parley.ids import specialist_workflow_id
from parley.specialists import CLOSING_TEXT, SpecialistOutcome
from parley.store.db import Database
from tests.support.client import ParleyClient
from tests.support.histories import replay_delegated_turn
from tests.support.sse import TERMINAL, Event, iter_events
from tests.support.stack import serve
from tests.support.toolkit import Stack, own_stack, reply, returns_made

ASK = "I want to return something from order 8390."


@pytest_asyncio.fixture(scope="module")
async def backend() -> AsyncIterator[tuple[str, httpx.AsyncClient]]:
    async with serve(create_backend()) as url, httpx.AsyncClient(base_url=url) as client:
        yield url, client


async def follow(
    client: ParleyClient, sid: str, turn_id: str, after: int | None = None
) -> list[Event]:
    """The turn's stream after `after`, until it ends or rests (on a question or a card)."""
    headers = {"Last-Event-ID": str(after)} if after is not None else {}
    url = f"/v1/sessions/{sid}/turns/{turn_id}/events"
    received: list[Event] = []
    async with client.http.stream("GET", url, headers=headers, timeout=60) as response:
        assert response.status_code == 200
        async for event in iter_events(response):
            if event.id is None:
                continue  # the retry frame
            received.append(event)
            if event.type in TERMINAL:
                break
    return received


async def answer(
    client: ParleyClient, sid: str, text: str, value: str | None = None
) -> dict[str, Any]:
    body = {"client_message_id": uuid.uuid4().hex, "text": text, "interaction_value": value}
    posted = await client.http.post(f"/v1/sessions/{sid}/messages", json=body)
    assert posted.status_code == 202, posted.text
    return dict(posted.json())


def types(events: list[Event]) -> list[str]:
    return [e.type for e in events]


async def test_the_returns_conversation(
    settings: Settings,
    temporal_client: Client,
    sessions: Database,
    backend: tuple[str, httpx.AsyncClient],
    tokens: dict[str, str],
    specialists_on: None,
) -> None:
    url, northwind = backend
    async with own_stack(
        temporal_client,
        settings,
        sessions,
        DemoModel(token_delay_s=0),
        prefix="returns",
        northwind_url=url,
    ) as running:
        priya = ParleyClient(running.url, tokens["priya"])
        try:
            turn_id = await _returns_conversation(priya, northwind)
        finally:
            await priya.aclose()
        await replay_delegated_turn(temporal_client, turn_id, names=("delegated_turn", "returns"))


async def _returns_conversation(priya: ParleyClient, northwind: httpx.AsyncClient) -> str:
    sid = await priya.new_session()
    posted = await priya.post(sid, ASK)
    assert posted.status_code == 202, posted.text
    turn_id = posted.json()["turn_id"]

    # The turn hands over, and the specialist asks which item: both of the order's items.
    events = await follow(priya, sid, turn_id)
    assert events[-1].type == "interaction", types(events)
    assert types(events).index("subagent") < len(events) - 1
    assert [e.data for e in events if e.type == "subagent"] == [
        {"name": "returns", "phase": "start"}
    ]
    which = events[-1].data
    assert which["question"] == "Which item?"
    assert [(o["label"], o["value"]) for o in which["options"]] == [
        ("Trail Runner shoes, size 8", "8390-1"),
        ("Wool socks (3-pack)", "8390-2"),
    ]
    assert (await priya.turn_view(sid, turn_id))["state"] == "awaiting_input"

    # An option click answers the waiting specialist: the same turn, no new one.
    assert (await answer(priya, sid, "Trail Runner shoes, size 8", "8390-1"))["turn_id"] == turn_id
    events = await follow(priya, sid, turn_id, after=events[-1].id)
    assert events[-1].type == "interaction", types(events)
    why = events[-1].data
    assert why["question"] == "Why are you returning it?"
    assert [o["value"] for o in why["options"]] == [
        "too_small",
        "too_large",
        "damaged",
        "changed_my_mind",
    ]
    assert why["interaction_id"] != which["interaction_id"]

    # The second answer; the window is checked, and the return waits for the user's confirm.
    assert (await answer(priya, sid, "Too small", "too_small"))["turn_id"] == turn_id
    events = await follow(priya, sid, turn_id, after=events[-1].id)
    assert events[-1].type == "confirmation_required", types(events)
    checked = [e.data["name"] for e in events if e.type == "tool"]
    assert "check_return_eligibility" in checked
    card = events[-1].data["action"]
    assert card["tool"] == "create_return" and card["status"] == "pending"
    assert "Trail Runner shoes" in card["summary"] and "too small" in card["summary"]
    assert await returns_made(northwind) == []  # nothing before the confirm

    # Two confirms at once: one return.
    confirm = f"/v1/sessions/{sid}/actions/{card['id']}/confirm"
    first, second = await asyncio.gather(priya.http.post(confirm), priya.http.post(confirm))
    assert sorted([first.status_code, second.status_code]) == [202, 409]
    rest = await follow(priya, sid, turn_id, after=events[-1].id)
    assert types(rest)[-1] == "done"
    assert [e.data for e in rest if e.type == "subagent"] == [{"name": "returns", "phase": "end"}]
    assert types(rest).index("subagent") < types(rest).index("done")
    made = await returns_made(northwind)
    assert len(made) == 1
    assert re.fullmatch(r"RMA-\d+", made[0]["rma_id"])
    assert (made[0]["order_id"], made[0]["item_id"], made[0]["reason"]) == (
        "8390",
        "8390-1",
        "too_small",
    )
    assert made[0]["rma_id"] in reply(rest)
    again = await priya.http.post(confirm)
    assert again.status_code == 409 and again.json()["error"]["code"] == "action_resolved"
    assert len(await returns_made(northwind)) == 1
    assert (await priya.turn_view(sid, turn_id))["state"] == "completed"
    # The answers joined the delegating turn: one turn for the whole conversation.
    messages = await priya.messages(sid)
    assert {m["turn_id"] for m in messages} == {turn_id}
    return str(turn_id)


async def test_answers_in_words_and_a_left_waiting_specialist(
    settings: Settings,
    temporal_client: Client,
    sessions: Database,
    backend: tuple[str, httpx.AsyncClient],
    tokens: dict[str, str],
    specialists_on: None,
) -> None:
    """Typed answers pick their options; a question nobody answers ends the turn politely,
    and the next message starts a turn of its own."""
    url, northwind = backend
    async with own_stack(
        temporal_client,
        settings,
        sessions,
        DemoModel(token_delay_s=0),
        prefix="returns-wait",
        northwind_url=url,
        specialist_wait_s=1.5,
    ) as running:
        priya = ParleyClient(running.url, tokens["priya"])
        try:
            await _left_waiting(priya, running)
        finally:
            await priya.aclose()


async def _left_waiting(priya: ParleyClient, running: Stack[DemoModel]) -> None:
    sid = await priya.new_session()
    turn_id = (await priya.post(sid, ASK)).json()["turn_id"]
    events = await follow(priya, sid, turn_id)
    assert events[-1].type == "interaction", types(events)
    # In words: "the socks" names one option.
    assert (await answer(priya, sid, "the socks please"))["turn_id"] == turn_id
    events = await follow(priya, sid, turn_id, after=events[-1].id)
    assert events[-1].type == "interaction", types(events)
    assert events[-1].data["question"] == "Why are you returning it?"

    # Nobody answers: the specialist hands back and the turn completes with its words.
    rest = await follow(priya, sid, turn_id, after=events[-1].id)
    assert reply(rest) == CLOSING_TEXT[SpecialistOutcome.timed_out]
    assert [e.data["phase"] for e in rest if e.type == "subagent"] == ["end"]
    assert (await priya.turn_view(sid, turn_id))["state"] == "completed"

    # A new message is a turn of its own, answered as usual.
    new_turn, later = await priya.turn(sid, "Where is my order 8472?")
    assert new_turn != turn_id
    assert "subagent" not in types(later) and "interaction" not in types(later)
    assert "8472" in reply(later)


async def test_stop_while_the_specialist_waits_cancels_it_with_the_turn(
    settings: Settings,
    temporal_client: Client,
    sessions: Database,
    backend: tuple[str, httpx.AsyncClient],
    tokens: dict[str, str],
    specialists_on: None,
) -> None:
    url, _ = backend
    async with own_stack(
        temporal_client,
        settings,
        sessions,
        DemoModel(token_delay_s=0),
        prefix="returns-stop",
        northwind_url=url,
    ) as running:
        priya = ParleyClient(running.url, tokens["priya"])
        try:
            sid = await priya.new_session()
            turn_id = (await priya.post(sid, ASK)).json()["turn_id"]
            events = await follow(priya, sid, turn_id)
            assert events[-1].type == "interaction", types(events)
            stop = await priya.http.post(f"/v1/sessions/{sid}/turns/{turn_id}/cancel")
            assert stop.status_code == 202, stop.text
            rest = await follow(priya, sid, turn_id, after=events[-1].id)
            assert types(rest)[-1] == "cancelled", types(rest)
            assert (await priya.turn_view(sid, turn_id))["state"] == "cancelled"
        finally:
            await priya.aclose()
    child = temporal_client.get_workflow_handle(specialist_workflow_id(turn_id=turn_id))
    assert (await child.describe()).status == WorkflowExecutionStatus.CANCELED
