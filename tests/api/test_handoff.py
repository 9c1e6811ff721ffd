"""A hand-off to a person, through the public API on the shared stack (issue 43, acceptance 1
and 3): the demo's "I want to talk to a person" opens a case (from the POST, no model asked:
parley/handoff_rules.py) whose summary names the order and the earlier refund question; an
agent claims it (a second claim is 409), replies under their name into the customer's
stream; the customer's next message reaches the agent and no model; an internal note never
reaches the customer; after the hand-back the assistant answers again, with the human
exchange in its prompt. Another tenant's agent finds nothing (404). The other tests open
their case by the model's `handoff_to_human`."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import httpx
import pytest
import pytest_asyncio
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError

from parley.config import Settings
from parley.dispatch.outbox import Starts, sweep_tick
from parley.handoff_rules import HandoffRules
from parley.handoffs import OPENED_TEXT, handoff_workflow_id
from parley.store import handoff_openers as openers
from parley.store.db import Database
from parley.store.identity import create_token
from parley.store.models import User
from tests.support.client import ParleyClient
from tests.support.orm import orm
from tests.support.sse import Event, iter_events
from tests.support.toolkit import eventually

DEADLINE_S = 20.0  # a bound on what the worker does in the background, never a wait


@pytest_asyncio.fixture
async def agents(api_url: str, sessions: Database) -> AsyncIterator[dict[str, ParleyClient]]:
    """Northwind's Sam and Lee, Southwind's Kim (seeded with the role `agent`)."""
    clients: dict[str, ParleyClient] = {}
    async with sessions() as db:
        for name, tenant in (("sam", "northwind"), ("lee", "northwind"), ("kim", "southwind")):
            token = await create_token(db, tenant_id=tenant, user_id=f"agent_{name}")
            clients[name] = ParleyClient(api_url, token)
        await db.commit()
    yield clients
    for client in clients.values():
        await client.aclose()


# Words the demo model hands off for with its `handoff_to_human` tool, and the code's check
# of a customer asking for a person leaves to it (parley/handoff_rules.py).
TO_THE_MODEL = "Could a representative help me?"
# Words the code's check hears: the case opens from the POST, with no turn.
PLAINLY = "I want to talk to a person"


async def _handed_off(priya: ParleyClient, ask: str = TO_THE_MODEL) -> tuple[str, str]:
    """Priya's reference conversation up to the refund, then a person asked for: the session
    and the case."""
    sid = await priya.new_session()
    for text in ("Where is my order?", "What about the refund?"):
        _, events = await priya.turn(sid, text)
        assert events[-1].type == "done", events
    if ask == PLAINLY:
        posted = await priya.post(sid, ask)
        assert posted.status_code == 202 and posted.json()["turn_id"] is None, posted.text
    else:
        _, events = await priya.turn(sid, ask)
        assert events[-1].type == "done", events
    found = await priya.http.get(f"/v1/sessions/{sid}/handoff")
    assert found.status_code == 200, found.text
    assert found.json()["status"] == "waiting"
    return sid, found.json()["id"]


async def _case(agent: ParleyClient, handoff_id: str) -> dict[str, Any]:
    """The case as the agent reads it, once its summary is written (a deadline, not a wait)."""
    async with asyncio.timeout(DEADLINE_S):
        while True:
            read = await agent.http.get(f"/v1/handoffs/{handoff_id}")
            assert read.status_code == 200, read.text
            if read.json()["handoff"]["summary"] is not None:
                return dict(read.json())
            await asyncio.sleep(0.1)


async def _case_events(client: ParleyClient, url: str, *, until: str) -> list[Event]:
    """The case's stream from its start, read until an event whose JSON holds `until`."""
    received: list[Event] = []
    async with asyncio.timeout(DEADLINE_S):
        async with client.http.stream("GET", url, params={"after": 0}) as response:
            assert response.status_code == 200
            async for event in iter_events(response):
                received.append(event)
                if until in json.dumps(event.data):
                    return received
    raise AssertionError("unreachable")


async def test_a_person_takes_over_and_hands_back(
    priya: ParleyClient,
    agents: dict[str, ParleyClient],
    sessions: Database,
) -> None:
    sam = agents["sam"]
    sid, handoff_id = await _handed_off(priya, PLAINLY)
    inbox = await sam.http.get("/v1/handoffs")
    assert inbox.status_code == 200
    assert handoff_id in [case["id"] for case in inbox.json()["handoffs"]]
    case = await _case(sam, handoff_id)
    summary = case["handoff"]["summary"]
    assert "8472" in summary and "refund" in summary.lower(), summary
    assert case["handoff"]["summary_by"] == "model"
    assert [m["text"] for m in case["messages"] if m["role"] == "user"][-1] == PLAINLY
    assert case["handoff"]["opened_by"] == "user_asked"

    claimed = await sam.http.post(f"/v1/handoffs/{handoff_id}/claim")
    assert claimed.status_code == 200 and claimed.json()["handoff"]["agent_name"] == "Sam"
    reply = await sam.http.post(
        f"/v1/handoffs/{handoff_id}/messages", json={"text": "Hi Priya, Sam here. Let me look."}
    )
    assert reply.status_code == 201, reply.text
    events_url = (await priya.http.get(f"/v1/sessions/{sid}/handoff")).json()["events_url"]
    seen = await _case_events(priya, events_url, until="Sam here")
    joined = [e.data for e in seen if e.type == "handoff"]
    assert {"status": "claimed", "agent_name": "Sam"}.items() <= joined[-1].items()
    assert seen[-1].type == "message" and seen[-1].data["message"]["author_name"] == "Sam"

    # The customer's next message goes to Sam: no turn, no model call. (The shared worker's
    # model also folds other sessions' summaries in the background: its call counter is no
    # measure of this session.)
    asked = await _asked(sessions, sid)
    posted = await priya.post(sid, "My parcel is late and I am worried.")
    assert posted.status_code == 202, posted.text
    assert (posted.json()["turn_id"], posted.json()["handoff_id"]) == (None, handoff_id)
    detail = await sam.http.get(f"/v1/handoffs/{handoff_id}")
    assert detail.json()["messages"][-1]["text"] == "My parcel is late and I am worried."
    note = await sam.http.post(
        f"/v1/handoffs/{handoff_id}/notes", json={"text": "INTERNAL-NOTE-7731 check carrier"}
    )
    assert note.status_code == 201
    assert await _asked(sessions, sid) == asked, "the model was asked while a person held it"

    back = await sam.http.post(f"/v1/handoffs/{handoff_id}/hand-back")
    assert back.status_code == 200 and back.json()["handoff"]["status"] == "handed_back"
    ended = await _case_events(priya, events_url, until="handed_back")
    assert not any("INTERNAL-NOTE-7731" in json.dumps(e.data) for e in ended)
    assert not any("INTERNAL-NOTE-7731" in m["text"] for m in await priya.messages(sid))

    # The assistant again, with the human exchange in its prompt.
    turn_id, events = await priya.turn(sid, "Thanks. Where is my order now?")
    assert events[-1].type == "done"
    prompt = await _prompt(sessions, turn_id)
    assert "Sam here" in prompt and "My parcel is late" in prompt
    # Sam's words are marked as his, so the model does not take them for its own.
    assert "[Sam, a person on the support team, wrote:] Hi Priya, Sam here." in prompt


async def test_every_tab_hears_the_case_on_the_session_stream(
    priya: ParleyClient, agents: dict[str, ParleyClient]
) -> None:
    """The session stream (every tab and device of the customer's) carries the case: its
    moves (`handoff`) and the conversation's messages while a person holds it, none of them
    a turn's."""
    sam = agents["sam"]
    sid, handoff_id = await _handed_off(priya, PLAINLY)
    url = f"/v1/handoffs/{handoff_id}"
    assert (await sam.http.post(url + "/claim")).status_code == 200
    said = await sam.http.post(url + "/messages", json={"text": "Hello from Sam, on it."})
    assert said.status_code == 201
    frames: list[Event] = []
    async with asyncio.timeout(DEADLINE_S):
        async with priya.http.stream(
            "GET", f"/v1/sessions/{sid}/stream", headers={"Last-Event-ID": "0"}
        ) as response:
            assert response.status_code == 200
            async for event in iter_events(response):
                frames.append(event)
                if "Hello from Sam" in json.dumps(event.data):
                    break
    moves = [(f.data["handoff_id"], f.data["status"]) for f in frames if f.type == "handoff"]
    assert moves == [(handoff_id, "waiting"), (handoff_id, "claimed")]
    held = [f.data["message"] for f in frames if f.type == "message"][-3:]
    assert [(m["role"], m["text"], m["turn_id"]) for m in held[:2]] == [
        ("user", PLAINLY, None),
        ("assistant", OPENED_TEXT, None),
    ]
    assert (held[2]["role"], held[2]["author_name"]) == ("assistant", "Sam")


async def test_case_streams_count_against_the_users_open_streams(
    api_url: str, sessions: Database, settings: Settings
) -> None:
    """A case's stream is one of the caller's open streams, as a turn's or the session's
    is: past `PARLEY_MAX_STREAMS_PER_USER` the next is 429, and a closed one frees its slot."""
    user_id = f"cust_streams_{uuid.uuid4().hex[:8]}"  # a customer of their own: no other streams
    async with orm(sessions) as db:
        db.add(User(tenant_id="northwind", id=user_id, display_name="Streams"))
        await db.commit()
    async with sessions() as db:
        customer = ParleyClient(
            api_url, await create_token(db, tenant_id="northwind", user_id=user_id)
        )
        await db.commit()
    held: list[Any] = []
    try:
        sid = await customer.new_session()
        posted = await customer.post(sid, PLAINLY)
        url = f"/v1/sessions/{sid}/handoffs/{posted.json()['handoff_id']}/events"
        for _ in range(settings.max_streams_per_user):
            context = customer.http.stream("GET", url)
            held.append(context)
            assert (await context.__aenter__()).status_code == 200
        for over in (url, f"/v1/sessions/{sid}/stream"):  # a case's, or any other stream
            refused = await customer.http.get(over)
            assert refused.status_code == 429, refused.text
            assert refused.json()["error"]["code"] == "rate_limited"
        await held.pop().__aexit__(None, None, None)

        async def admitted_again() -> bool:
            context = customer.http.stream("GET", url)
            response = await context.__aenter__()
            if response.status_code == 200:
                held.append(context)
                return True
            await response.aread()
            await context.__aexit__(None, None, None)
            return False

        await eventually(admitted_again, timeout=10, what="a closed case stream frees its slot")
    finally:
        for context in held:
            await context.__aexit__(None, None, None)
        await customer.aclose()


async def _asked(sessions: Database, sid: str) -> tuple[int, int]:
    """The session's turns and the model calls they made, as the record holds them."""
    async with sessions() as db:
        turns = await db.value("SELECT count(*) FROM turns WHERE session_id = %(s)s", {"s": sid})
        calls = await db.value(
            "SELECT count(*) FROM model_calls m JOIN turns t ON t.id = m.turn_id"
            " WHERE t.session_id = %(s)s",
            {"s": sid},
        )
    return turns, calls


async def _prompt(sessions: Database, turn_id: str) -> str:
    async with sessions() as db:
        request = await db.value(
            "SELECT request FROM model_calls WHERE turn_id = %(t)s ORDER BY step LIMIT 1",
            {"t": turn_id},
        )
    return json.dumps(request)


async def test_one_agent_wins_a_claim_and_another_tenant_sees_nothing(
    priya: ParleyClient, agents: dict[str, ParleyClient]
) -> None:
    _, handoff_id = await _handed_off(priya)
    sam, lee, kim = agents["sam"], agents["lee"], agents["kim"]
    url = f"/v1/handoffs/{handoff_id}"
    answers = await asyncio.gather(sam.http.post(url + "/claim"), lee.http.post(url + "/claim"))
    assert sorted(a.status_code for a in answers) == [200, 409]
    [lost] = [a for a in answers if a.status_code == 409]
    assert lost.json()["error"]["code"] == "handoff_claimed"
    winner = sam if answers[0].status_code == 200 else lee
    loser = lee if winner is sam else sam
    # Only the holder replies or ends it.
    refused = await loser.http.post(url + "/messages", json={"text": "me too"})
    assert refused.status_code == 409
    for request in (
        kim.http.get(url),
        kim.http.post(url + "/claim"),
        kim.http.post(url + "/notes", json={"text": "peek"}),
        kim.http.post(url + "/resolve"),
        kim.http.get(url + "/events"),
    ):
        answer: httpx.Response = await request
        assert answer.status_code == 404, answer.text
    assert handoff_id not in json.dumps((await kim.http.get("/v1/handoffs")).json())
    # A customer is no agent.
    assert (await priya.http.get("/v1/handoffs")).status_code == 403
    resolved = await winner.http.post(url + "/resolve")
    assert resolved.json()["handoff"]["status"] == "resolved"
    again = await winner.http.post(url + "/resolve")
    assert again.json()["error"]["code"] == "handoff_closed"


async def test_while_a_person_holds_the_session_the_assistant_cannot_be_made_to_answer(
    priya: ParleyClient, agents: dict[str, ParleyClient]
) -> None:
    """An edit or a regenerate would have the assistant answer behind the person's back: each
    is 409 `handoff_open` until the hand-back, and nothing changes; after it, a regenerate runs
    as usual. (Showing another version is refused the same way, store/branches `_free`.)"""
    sid, handoff_id = await _handed_off(priya)
    listed = (await priya.http.get(f"/v1/sessions/{sid}/messages")).json()["messages"]
    first_question = next(m for m in listed if m["role"] == "user")
    last_answer = [m for m in listed if m["role"] == "assistant"][-1]
    tries = {
        "edit": priya.http.post(
            f"/v1/sessions/{sid}/messages/{first_question['id']}/edit",
            json={"client_message_id": "edit-while-held", "text": "Where is order 8472?"},
        ),
        "regenerate": priya.http.post(
            f"/v1/sessions/{sid}/turns/{last_answer['turn_id']}/regenerate"
        ),
    }
    for name, attempt in tries.items():
        refused = await attempt
        assert refused.status_code == 409, (name, refused.text)
        assert refused.json()["error"]["code"] == "handoff_open", name
        assert refused.json()["error"]["handoff_id"] == handoff_id, name
    after = (await priya.http.get(f"/v1/sessions/{sid}/messages")).json()["messages"]
    assert [m["id"] for m in after] == [m["id"] for m in listed]

    sam = agents["sam"]
    claims, hand_backs = await _measured(priya)
    assert (await sam.http.post(f"/v1/handoffs/{handoff_id}/claim")).status_code == 200
    assert (await sam.http.post(f"/v1/handoffs/{handoff_id}/hand-back")).status_code == 200
    # An operator sees the claim and the hand-back in the API's metrics.
    assert await _measured(priya) == (claims + 1, hand_backs + 1)
    again = await priya.http.post(f"/v1/sessions/{sid}/turns/{last_answer['turn_id']}/regenerate")
    assert again.status_code == 202, again.text


async def _measured(client: ParleyClient) -> tuple[float, float]:
    """How many claims and hand-backs the API's metrics have timed so far."""
    text = (await client.http.get("/metrics")).text

    def count(series: str) -> float:
        for line in text.splitlines():
            if line.startswith(series + " "):
                return float(line.split()[-1])
        return 0.0

    return (
        count("parley_handoff_claim_seconds_count"),
        count('parley_handoff_open_seconds_count{outcome="handed_back"}'),
    )


async def test_a_case_whose_run_never_started_is_started_by_the_outbox_sweep(
    priya: ParleyClient,
    agents: dict[str, ParleyClient],
    sessions: Database,
    temporal_client: Client,
    settings: Settings,
) -> None:
    # The API died between the case's commit and its run's start: the case is in the inbox,
    # with no run (no summary, no claim clock, no webhook).
    sid = await priya.new_session()
    async with sessions() as db:
        opened = await openers.open_asked(
            db,
            session_id=sid,
            text=PLAINLY,
            client_message_id=f"lost-{uuid.uuid4().hex[:8]}",
            rules=HandoffRules(),
        )
        await db.commit()
    assert opened is not None
    case_id = opened.case.id
    run = temporal_client.get_workflow_handle(
        handoff_workflow_id(session_id=sid, handoff_id=case_id)
    )
    with pytest.raises(RPCError):
        await run.describe()
    starts = Starts(temporal_client, sessions, settings.task_queue)
    assert await sweep_tick(starts, grace=timedelta(0))
    # Its run took it from there: the summary for the person is written.
    case = await _case(agents["sam"], case_id)
    assert case["handoff"]["status"] == "waiting" and case["handoff"]["summary"]
    assert (await run.describe()).status == WorkflowExecutionStatus.RUNNING
