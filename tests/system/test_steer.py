"""Steering a running answer (issue 42, acceptance 4): a message posted with `"mode": "steer"`
while a turn runs is taken into that turn at its next safe boundary. A slow provider (120 ms
a word) answers from a script that reads the request it gets, as a real model would."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest_asyncio
from sqlalchemy import func, select
from temporalio.client import Client

from parley.config import Settings
from parley.eval.command import EXIT_REGRESSION, Options, evaluate
from parley.gateway.base import ModelRequest
from parley.screens import DECLINE_TEXT
from parley.store.db import Database
from parley.store.models import Turn
from tests.support.client import ParleyClient, streamed_text
from tests.support.evals import eval_target
from tests.support.models import Reply, ScriptedModel, call
from tests.support.orm import orm
from tests.support.sse import Event
from tests.support.toolkit import (
    emails,
    eventually,
    first_events,
    model_calls,
    own_stack,
    types,
)

TOKEN_DELAY_S = 0.12
LONG_ANSWER = " ".join(f"word{n}" for n in range(60))  # about 7 s at this pace
STEER = "Stop, just tell me the short version"
SHORT = "Short version: all is well."
ARRIVAL = "When does it arrive?"
ETA = "It should arrive on Oct 30."
EMAIL = {"order_id": "8472", "template": "order_status_summary"}
# Short replies for the turns that only need to end (not the long answer's 7 s each).
QUICK = {"Hello there": "Hello! How can I help?", "Thanks": "You're welcome."}


@dataclass
class Steering:
    model: ScriptedModel
    client: ParleyClient
    url: str


def said_last(request: ModelRequest) -> str:
    """The text of the last user message the model is shown."""
    users = [m for m in request.messages if m["role"] == "user"]
    return str(users[-1]["content"]) if users else ""


def answer(request: ModelRequest, _: int) -> Reply:
    """The long answer, unless the user steered; a question about an order reads the open
    orders first, and one asking for an email proposes it."""
    if STEER in said_last(request):
        return SHORT
    if said_last(request) in QUICK:
        return QUICK[said_last(request)]
    if ARRIVAL in said_last(request):
        return ETA
    if "email" in said_last(request):
        if any(m["role"] == "tool" for m in request.messages):
            return "Shall I send it?"
        return [call("call_e", "propose_email", EMAIL)]
    asked_orders = "order" in said_last(request)
    if asked_orders and not any(m["role"] == "tool" for m in request.messages):
        return [call("call_1", "list_open_orders", {})]
    return LONG_ANSWER


@pytest_asyncio.fixture(scope="module")
async def steering(
    temporal_client: Client, settings: Settings, sessions: Database, tokens: dict[str, str]
) -> AsyncIterator[Steering]:
    model = ScriptedModel(script=answer, token_delay_s=TOKEN_DELAY_S)
    async with own_stack(temporal_client, settings, sessions, model, prefix="steer") as stack:
        client = ParleyClient(stack.url, tokens["priya"])
        try:
            yield Steering(model, client, stack.url)
        finally:
            await client.aclose()


async def turns_of(sessions: Database, sid: str) -> int:
    async with orm(sessions) as db:
        return int(
            await db.scalar(select(func.count()).select_from(Turn).where(Turn.session_id == sid))
            or 0
        )


def no_call_without_its_result(request: ModelRequest) -> bool:
    """Every tool call the request shows is answered by a `tool` message after it, before the
    next user message."""
    open_calls: set[str] = set()
    for m in request.messages:
        if m["role"] == "user" and open_calls:
            return False
        for c in m.get("tool_calls") or []:
            open_calls.add(str(c["id"]))
        if m["role"] == "tool":
            open_calls.discard(str(m["tool_call_id"]))
    return not open_calls


async def steer(client: ParleyClient, sid: str, text: str = STEER) -> dict[str, Any]:
    posted = await client.post(sid, text, mode="steer")
    assert posted.status_code == 202, posted.text
    return dict(posted.json())


async def test_a_steer_after_the_first_delta_stops_the_stream_and_is_answered_in_the_turn(
    steering: Steering, sessions: Database
) -> None:
    client, model = steering.client, steering.model
    model.requests.clear()
    sid = await client.new_session()
    posted = (await client.post(sid, "Tell me everything about my account")).json()
    turn_id, url = posted["turn_id"], posted["events_url"]
    head = await first_events(client, url, until="delta")
    assert head[-1].type == "delta", types(head)
    partial_id = head[-1].data["message_id"]

    steered = await steer(client, sid)
    # Taken into the running turn: no second turn, the message stored once in it.
    assert steered["turn_id"] == turn_id and steered["steered"] is True
    rest = await client.events(sid, turn_id, last_event_id=head[-1].id)
    events = head + rest
    assert events[-1].type == "done", types(events)
    [taken] = [e for e in events if e.type == "steered"]
    assert taken.data == {
        "message_id": steered["message"]["id"],
        "superseded_message_id": partial_id,
    }
    final = events[-1].data["message"]
    assert final["text"] == SHORT and final["id"] != partial_id

    # The stream stopped: far fewer words than the long answer were generated for it.
    partial = "".join(
        e.data["text"] for e in events if e.type == "delta" and e.data["message_id"] == partial_id
    )
    assert partial and LONG_ANSWER.startswith(partial.strip())
    assert len(partial.split()) < len(LONG_ANSWER.split()) // 2
    # The last model call holds the steer; the superseded partial is no answer.
    assert STEER in said_last(model.requests[-1])
    assert len(model.requests) == 2
    stored = await client.messages(sid)
    assert [(m["role"], m["text"]) for m in stored] == [
        ("user", "Tell me everything about my account"),
        ("user", STEER),
        ("assistant", SHORT),
    ]
    assert all(partial.strip() not in m["text"] for m in stored if m["role"] == "assistant")
    assert await turns_of(sessions, sid) == 1
    calls = await model_calls(sessions, turn_id)
    assert [c.finish_reason for c in calls] == ["steered", "stop"]
    # The session is free, and the steer does not come back in the next turn's answer.
    _, thanked = await client.turn(sid, "Thanks")
    assert thanked[-1].type == "done" and streamed_text(thanked) == QUICK["Thanks"]


async def test_a_steer_during_a_tool_call_is_taken_after_its_result(
    steering: Steering, sessions: Database, northwind: httpx.AsyncClient
) -> None:
    client, model = steering.client, steering.model
    model.requests.clear()
    sid = await client.new_session()
    # The backend answers slowly: the steer comes while the tool call runs.
    await northwind.post("/faults", json={"latency_ms": 1500})
    posted = (await client.post(sid, "Where is my order?")).json()
    turn_id, url = posted["turn_id"], posted["events_url"]
    head = await first_events(client, url, until="tool")
    assert head[-1].type == "tool", types(head)
    steered = await steer(client, sid)
    assert steered["turn_id"] == turn_id
    rest = await client.events(sid, turn_id, last_event_id=head[-1].id)
    events: list[Event] = head + rest
    assert events[-1].type == "done", types(events)
    assert events[-1].data["message"]["text"] == SHORT
    [taken] = [e for e in events if e.type == "steered"]
    # No stream was stopped: the model had asked for a tool, and its batch ran to the end.
    assert taken.data["superseded_message_id"] is None
    assert len(model.requests) == 2
    last = model.requests[-1]
    roles = [m["role"] for m in last.messages]
    # The tool's result, then the steer: no call without its result before the user speaks.
    assert roles[-3:] == ["assistant", "tool", "user"] and said_last(last) == STEER
    assert no_call_without_its_result(last)
    assert await turns_of(sessions, sid) == 1
    assert streamed_text(events) == SHORT


async def test_a_steer_with_no_turn_running_is_a_normal_post(steering: Steering) -> None:
    client = steering.client
    sid = await client.new_session()
    posted = await steer(client, sid, "Hello there")
    assert posted["steered"] is False
    events = await client.events(sid, posted["turn_id"])
    assert events[-1].type == "done" and not [e for e in events if e.type == "steered"]
    assert streamed_text(events) == QUICK["Hello there"]


async def test_the_same_steer_twice_is_stored_once(steering: Steering, sessions: Database) -> None:
    client = steering.client
    sid = await client.new_session()
    posted = (await client.post(sid, "Tell me everything about my account")).json()
    await first_events(client, posted["events_url"], until="delta")
    first = await client.post(sid, STEER, client_message_id="steer-1", mode="steer")
    again = await client.post(sid, STEER, client_message_id="steer-1", mode="steer")
    assert (first.status_code, again.status_code) == (202, 200)
    assert again.json()["message"]["id"] == first.json()["message"]["id"]
    events = await client.events(sid, posted["turn_id"])
    assert events[-1].type == "done"
    assert len([e for e in events if e.type == "steered"]) == 1
    stored = await eventually(lambda: client.messages(sid), timeout=5, what="messages")
    assert [m["text"] for m in stored].count(STEER) == 1
    assert await turns_of(sessions, sid) == 1


SUITE = f"""
name: a steered answer
user: cust_2291
steps:
  - say: Tell me everything about my account
    steer: {STEER}
    expect:
      steered: %s
      reply: {{contains: ["Short version"], not_contains: [word30]}}
"""


async def test_parley_eval_runs_a_steer_step(
    steering: Steering, sessions: Database, tmp_path: Path
) -> None:
    for expected, exit_code in (("true", 0), ("false", EXIT_REGRESSION)):
        suite = tmp_path / expected
        suite.mkdir()
        (suite / "steer.yaml").write_text(SUITE % expected)
        target = eval_target(steering.url, sessions, None)
        outcome = await evaluate(Options(suite=suite, quiet=True), target)
        # Taken into the running answer: `steered: false` is a failure the run names.
        assert outcome.exit_code == exit_code, outcome.regressions


async def test_a_steer_while_a_card_waits_is_answered_and_the_card_kept(
    steering: Steering, sessions: Database, northwind: httpx.AsyncClient
) -> None:
    client, model = steering.client, steering.model
    sid = await client.new_session()
    posted = (await client.post(sid, "Can you email me the status of order 8472?")).json()
    turn_id = posted["turn_id"]
    resting = await client.events(sid, turn_id)
    assert resting[-1].type == "confirmation_required", types(resting)
    card = resting[-1].data["action"]
    model.requests.clear()

    steered = await steer(client, sid, ARRIVAL)
    assert steered["turn_id"] == turn_id and steered["steered"] is True
    again = await client.events(sid, turn_id, last_event_id=resting[-1].id)
    # Answered in the turn, without tools, and the same card shown again.
    assert again[-1].type == "confirmation_required", types(again)
    assert again[-1].data["action"]["id"] == card["id"]
    assert [e.data["superseded_message_id"] for e in again if e.type == "steered"] == [None]
    assert streamed_text(again) == ETA
    [asked] = model.requests
    assert said_last(asked) == ARRIVAL and asked.tools == []
    view = await client.session_view(sid)
    assert view["pending_action"]["id"] == card["id"]

    confirmed = await client.http.post(f"/v1/sessions/{sid}/actions/{card['id']}/confirm")
    assert confirmed.status_code == 202, confirmed.text
    done = await client.events(sid, turn_id, last_event_id=again[-1].id)
    assert done[-1].type == "done", types(done)
    assert len(await emails(northwind, action_id=card["id"])) == 1
    assert await turns_of(sessions, sid) == 1


async def test_a_steer_the_input_screen_declines_never_reaches_the_model(
    steering: Steering,
) -> None:
    client, model = steering.client, steering.model
    model.requests.clear()
    sid = await client.new_session()
    posted = (await client.post(sid, "Tell me everything about my account")).json()
    head = await first_events(client, posted["events_url"], until="delta")
    card_number = "My card is 4111 1111 1111 1111, use it"
    assert (await steer(client, sid, card_number))["steered"] is True
    events = head + await client.events(sid, posted["turn_id"], last_event_id=head[-1].id)
    assert events[-1].type == "done", types(events)
    assert events[-1].data["message"]["text"] == DECLINE_TEXT
    # The stream stopped for it, and no model was shown it.
    assert len(model.requests) == 1
    assert not any("4111" in str(m["content"]) for r in model.requests for m in r.messages)
