"""Issue 30, acceptance 2: a real model drives the Returns specialist. The real OpenAI SDK
talks to the local fake provider (its streaming wire format), scripted as a model would
answer: hand the return over, list the items, ask which item and why (the test answers by
posting the option the interaction offered), check the window and propose; the user's
confirm creates exactly one `RMA-` return. A reply with malformed arguments is answered
with an error and the model tries again; a model that never ends stops at the step bound.
A worker killed with SIGKILL while the specialist waits for the answer: a new worker takes
it, the model is not asked again for what it already answered, and there is one return.

The backend is this module's own, so its `GET /returns` holds only these returns.
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import pytest_asyncio
from temporalio.client import Client

from parley.config import Settings
from parley.demo_backend.app import create_app as create_backend
from parley.gateway.errors import Timeouts
from parley.gateway.fake_provider.server import FakeProvider, Reply, ToolCall
from parley.gateway.openai_compat import OpenAICompatProvider
from parley.ids import return_idempotency_key
from parley.returns_agent import AGENT_INSTRUCTIONS, AGENT_MAX_STEPS, EMPTY_REPLY
from parley.specialists import CLOSING_TEXT, SpecialistOutcome
from parley.store.db import Database
from tests.support.client import ParleyClient
from tests.support.histories import replay_delegated_turn
from tests.support.processes import Workers, read_until
from tests.support.sse import Event
from tests.support.stack import own_queue, serve, serve_api
from tests.support.toolkit import own_stack, reply, returns_made

ASK = "I want to return something from order 8390."
TIMEOUTS = Timeouts(connect_s=2.0, first_token_s=5.0, total_s=30.0)
# A ~5 s heartbeat or sticky-queue timeout for the killed worker's work, plus a start-up.
RECOVERY_S = 60

ITEM_OPTIONS = [
    {"label": "The Trail Runner shoes", "value": "8390-1"},
    {"label": "The wool socks", "value": "8390-2"},
]
REASON_OPTIONS = [
    {"label": "They are too small", "value": "too_small"},
    {"label": "They arrived damaged", "value": "damaged"},
]


def call(name: str, **arguments: Any) -> Reply:
    return Reply(tool_calls=[ToolCall(name=name, arguments=json.dumps(arguments))])


def handed_over() -> Reply:
    """The turn's model hands the return to the specialist."""
    return call("delegate_returns", order_id="8390")


def asks(question: str, options: list[dict[str, str]]) -> Reply:
    return call("ask_user", question=question, options=options)


def the_returns_script(
    *, malformed: bool = False, item: str = "8390-1", reason: str = "too_small"
) -> list[Reply]:
    """The specialist as a model would run it, proposing `item` for `reason`; with
    `malformed`, its first question arrives with broken JSON arguments first."""
    broken = Reply(
        tool_calls=[ToolCall(name="ask_user", arguments='{"question": "Which item?", "opt')]
    )
    return [
        handed_over(),
        call("list_order_items", order_id="8390"),
        *([broken] if malformed else []),
        asks("Which item would you like to return?", ITEM_OPTIONS),
        asks("What is wrong with them?", REASON_OPTIONS),
        call("check_return_window", order_id="8390"),
        call("propose_return", order_id="8390", item_id=item, reason=reason),
    ]


def specialist_requests(fake: FakeProvider) -> list[dict[str, Any]]:
    """The request bodies the specialist sent (its instructions are its first message)."""
    return [
        r.body
        for r in fake.requests
        if r.body.get("messages") and r.body["messages"][0].get("content") == AGENT_INSTRUCTIONS
    ]


def tool_results(body: dict[str, Any]) -> list[str]:
    return [m["content"] for m in body["messages"] if m["role"] == "tool"]


async def follow(client: ParleyClient, url: str, *, after: int, stop: str) -> list[Event]:
    events = await asyncio.wait_for(
        read_until(client, url, after=after, stop=stop), timeout=RECOVERY_S
    )
    return [e for e in events if e.id is not None]


async def answer(client: ParleyClient, sid: str, option: dict[str, str]) -> str:
    """Click an option the interaction offered: its label as the text, its value chosen."""
    body = {
        "client_message_id": uuid.uuid4().hex,
        "text": option["label"],
        "interaction_value": option["value"],
    }
    posted = await client.http.post(f"/v1/sessions/{sid}/messages", json=body)
    assert posted.status_code == 202, posted.text
    return str(posted.json()["turn_id"])


class Conversation:
    """One session's returns conversation, followed event by event."""

    def __init__(self, client: ParleyClient, sid: str, turn_id: str) -> None:
        self.client, self.sid, self.turn_id = client, sid, turn_id
        self.url = f"/v1/sessions/{sid}/turns/{turn_id}/events"
        self.events: list[Event] = []

    @classmethod
    async def start(cls, client: ParleyClient) -> Conversation:
        sid = await client.new_session()
        posted = await client.post(sid, ASK)
        assert posted.status_code == 202, posted.text
        return cls(client, sid, str(posted.json()["turn_id"]))

    async def until(self, stop: str) -> Event:
        after = self.events[-1].id or 0 if self.events else 0
        self.events += await follow(self.client, self.url, after=after, stop=stop)
        assert self.events[-1].type == stop, [(e.type, e.data) for e in self.events[-3:]]
        return self.events[-1]

    async def choose(self, interaction: Event, value: str) -> None:
        option = next(o for o in interaction.data["options"] if o["value"] == value)
        assert await answer(self.client, self.sid, option) == self.turn_id

    async def confirm(self, card: Event) -> None:
        action = card.data["action"]["id"]
        url = f"/v1/sessions/{self.sid}/actions/{action}/confirm"
        confirmed = await self.client.http.post(url)
        assert confirmed.status_code == 202, confirmed.text

    def types(self) -> list[str]:
        return [e.type for e in self.events]


# --- in this process: the conversation, and the misbehaving model -------------------------


@pytest_asyncio.fixture(scope="module")
async def backend() -> AsyncIterator[tuple[str, httpx.AsyncClient]]:
    async with serve(create_backend()) as url, httpx.AsyncClient(base_url=url) as client:
        yield url, client


@pytest_asyncio.fixture(scope="module")
async def fake_url() -> AsyncIterator[tuple[FakeProvider, str]]:
    # Brain mode answers what the script does not (the rolling summary after the turn).
    fake = FakeProvider(brain=True)
    async with serve(fake.app) as url:
        yield fake, url


@pytest_asyncio.fixture(scope="module")
async def agent_stack(
    settings: Settings,
    temporal_client: Client,
    sessions: Database,
    backend: tuple[str, httpx.AsyncClient],
    fake_url: tuple[FakeProvider, str],
) -> AsyncIterator[str]:
    provider = OpenAICompatProvider(
        base_url=f"{fake_url[1]}/v1", api_key="test-key", timeouts=TIMEOUTS
    )
    async with own_stack(
        temporal_client,
        settings,
        sessions,
        provider,
        prefix="returns-agent",
        northwind_url=backend[0],
        model_provider="openai",
        model="openai-test-model",
    ) as running:
        yield running.url
    await provider.aclose()


@pytest_asyncio.fixture
async def priya(
    agent_stack: str, tokens: dict[str, str], specialists_on: None
) -> AsyncIterator[ParleyClient]:
    client = ParleyClient(agent_stack, tokens["priya"])
    yield client
    await client.aclose()


@pytest.fixture
def fake(fake_url: tuple[FakeProvider, str]) -> FakeProvider:
    fake_url[0].reset()
    return fake_url[0]


async def test_a_real_model_asks_two_questions_and_proposes_the_return(
    priya: ParleyClient,
    fake: FakeProvider,
    backend: tuple[str, httpx.AsyncClient],
    temporal_client: Client,
) -> None:
    northwind = backend[1]
    before = len(await returns_made(northwind))
    fake.script(*the_returns_script(malformed=True))
    talk = await Conversation.start(priya)

    # The model's own question, with the options it chose; the broken reply before it was
    # answered with an error (no question came of it) and the model asked again.
    which = await talk.until("interaction")
    assert which.data["question"] == "Which item would you like to return?"
    assert which.data["options"] == ITEM_OPTIONS
    assert [e.data for e in talk.events if e.type == "subagent"] == [
        {"name": "returns", "phase": "start"}
    ]
    asked = specialist_requests(fake)
    assert len(asked) == 3
    assert "Trail Runner shoes" in tool_results(asked[1])[0]  # the items, from the backend
    assert "not a JSON object" in tool_results(asked[2])[-1]  # the broken call's error
    assert (await priya.turn_view(talk.sid, talk.turn_id))["state"] == "awaiting_input"

    await talk.choose(which, "8390-1")
    why = await talk.until("interaction")
    assert why.data["options"] == REASON_OPTIONS
    assert why.data["interaction_id"] != which.data["interaction_id"]
    assert '"8390-1"' in tool_results(specialist_requests(fake)[-1])[-1]  # what was chosen

    await talk.choose(why, "too_small")
    card = await talk.until("confirmation_required")
    assert "check_return_eligibility" in [e.data["name"] for e in talk.events if e.type == "tool"]
    action = card.data["action"]
    assert action["tool"] == "create_return" and action["status"] == "pending"
    assert "Trail Runner shoes" in action["summary"] and "too small" in action["summary"]
    assert len(await returns_made(northwind)) == before  # nothing before the confirm

    await talk.confirm(card)
    await talk.until("done")
    made = (await returns_made(northwind))[before:]
    assert len(made) == 1
    assert re.fullmatch(r"RMA-\d+", made[0]["rma_id"])
    assert (made[0]["item_id"], made[0]["reason"]) == ("8390-1", "too_small")
    assert made[0]["rma_id"] in reply(talk.events)
    assert talk.types().count("interaction") == 2
    assert [e.data["phase"] for e in talk.events if e.type == "subagent"] == ["start", "end"]
    assert len(specialist_requests(fake)) == 6  # one request per step, none asked twice
    assert (await priya.turn_view(talk.sid, talk.turn_id))["state"] == "completed"
    await replay_delegated_turn(
        temporal_client, talk.turn_id, names=("agent_turn", "agent_returns")
    )


async def test_a_model_that_never_ends_stops_at_the_step_bound(
    priya: ParleyClient, fake: FakeProvider, backend: tuple[str, httpx.AsyncClient]
) -> None:
    """A model that keeps calling a tool (and once an unknown one) is stopped after
    AGENT_MAX_STEPS model calls: the user is told, nothing is proposed or created."""
    before = len(await returns_made(backend[1]))
    looping = [call("list_order_items", order_id="8390")] * (AGENT_MAX_STEPS - 1)
    # Nothing scripted past the bound: a request after it would get the demo's answer, and
    # be counted below.
    fake.script(handed_over(), call("look_up_the_weather"), *looping)
    talk = await Conversation.start(priya)
    await talk.until("done")
    assert reply(talk.events) == CLOSING_TEXT[SpecialistOutcome.gave_up]
    asked = specialist_requests(fake)
    assert len(asked) == AGENT_MAX_STEPS
    assert "unknown tool 'look_up_the_weather'" in tool_results(asked[1])[0]
    assert "interaction" not in talk.types() and "confirmation_required" not in talk.types()
    assert len(await returns_made(backend[1])) == before
    assert (await priya.turn_view(talk.sid, talk.turn_id))["state"] == "completed"


async def test_an_empty_reply_is_asked_again_and_words_end_the_specialist(
    priya: ParleyClient, fake: FakeProvider
) -> None:
    """A reply with neither words nor a call is told so; a reply in words and no call is the
    specialist's last word, and the turn ends with it."""
    words = "I'm sorry, that order can't be returned any more."
    fake.script(handed_over(), Reply(), Reply(text=words))
    talk = await Conversation.start(priya)
    await talk.until("done")
    assert reply(talk.events) == words
    asked = specialist_requests(fake)
    assert len(asked) == 2
    assert asked[1]["messages"][-1] == {"role": "user", "content": EMPTY_REPLY}
    assert [e.data["phase"] for e in talk.events if e.type == "subagent"] == ["start", "end"]


async def test_a_proposal_the_user_did_not_choose_is_refused(
    priya: ParleyClient, fake: FakeProvider, backend: tuple[str, httpx.AsyncClient]
) -> None:
    """The user picks the socks; the model proposes the shoes anyway: no card, the model is
    told why, and nothing is created."""
    before = len(await returns_made(backend[1]))
    words = "Sorry, I got that wrong. Please start the return again."
    fake.script(
        handed_over(),
        asks("Which item would you like to return?", ITEM_OPTIONS),
        call("propose_return", order_id="8390", item_id="8390-1", reason="damaged"),
        Reply(text=words),
    )
    talk = await Conversation.start(priya)
    await talk.choose(await talk.until("interaction"), "8390-2")
    await talk.until("done")
    assert reply(talk.events) == words
    assert "confirmation_required" not in talk.types()
    told = tool_results(specialist_requests(fake)[-1])[-1]
    assert "the customer chose" in told
    assert len(await returns_made(backend[1])) == before


# --- real worker processes: one killed while the specialist waits ---------------------------


@pytest.fixture(scope="module")
def crash_settings(
    settings: Settings,
    backend: tuple[str, httpx.AsyncClient],
    fake_url: tuple[FakeProvider, str],
) -> Settings:
    return own_queue(
        settings,
        "agentcrash",
        northwind_url=backend[0],
        model_provider="openai",
        model="openai-test-model",
    )


async def test_worker_killed_while_the_model_driven_specialist_waits(
    crash_settings: Settings,
    tokens: dict[str, str],
    fake: FakeProvider,
    fake_url: tuple[FakeProvider, str],
    backend: tuple[str, httpx.AsyncClient],
    specialists_on: None,
) -> None:
    workers = Workers(crash_settings)
    workers.env.update(
        PARLEY_MODEL_PROVIDER="openai",
        PARLEY_MODEL="openai-test-model",
        OPENAI_BASE_URL=f"{fake_url[1]}/v1",
        OPENAI_API_KEY="test-key",
    )
    async with serve_api(crash_settings) as url:
        client = ParleyClient(url, tokens["priya"])
        try:
            await _conversation_with_a_kill(client, workers, fake, backend[1])
        finally:
            await client.aclose()
            workers.stop_all()


async def _conversation_with_a_kill(
    client: ParleyClient, workers: Workers, fake: FakeProvider, northwind: httpx.AsyncClient
) -> None:
    fake.script(*the_returns_script(item="8390-2", reason="damaged"))
    first = workers.start()
    talk = await Conversation.start(client)
    which = await talk.until("interaction")

    # Killed while the specialist waits for the user; the answer is kept by Temporal.
    assert first.poll() is None, "the worker died before the test killed it"
    first.send_signal(signal.SIGKILL)
    first.wait(10)
    await talk.choose(which, "8390-2")
    workers.start()
    why = await talk.until("interaction")
    assert why.data["question"] == "What is wrong with them?"

    await talk.choose(why, "damaged")
    card = await talk.until("confirmation_required")
    await talk.confirm(card)
    await talk.until("done")
    assert [e.id for e in talk.events] == list(range(1, len(talk.events) + 1))
    assert talk.types().count("interaction") == 2
    key = return_idempotency_key(action_id=card.data["action"]["id"])
    made = [r for r in await returns_made(northwind) if r["idempotency_key"] == key]
    assert len(made) == 1 and (made[0]["item_id"], made[0]["reason"]) == ("8390-2", "damaged")
    assert made[0]["rma_id"] in reply(talk.events)
    # The model answered each step once: the new worker replayed what was recorded.
    assert len(specialist_requests(fake)) == 5
