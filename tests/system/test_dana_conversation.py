"""Dana's conversation of design.md, end to end through the public API: a search stored as a
result set, a refinement of it, a CSV export of "those" behind a confirmation, a question
about "them", and a new scope. Once with the built-in demo model, once with a scripted
provider behind the local OpenAI-compatible fake server (through the real SDK), whose
prompts must carry the server's worked-out query and referent in the state block."""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import pytest_asyncio
from temporalio.client import Client

from parley.config import Settings
from parley.context import read_state_block
from parley.demo_backend.app import create_app as create_backend
from parley.gateway.demo import DemoModel
from parley.gateway.errors import Timeouts
from parley.gateway.fake_provider.server import FakeProvider, Reply, ToolCall
from parley.gateway.fake_provider.wire import request_from_openai
from parley.gateway.openai_compat import OpenAICompatProvider
from parley.store.db import Database
from parley.store.identity import create_token
from tests.support.client import ParleyClient
from tests.support.stack import serve
from tests.support.toolkit import emails, own_stack, reply

LAST_WEEK = {"placed_from": "2026-10-19", "placed_to": "2026-10-25"}
OVER_500 = {**LAST_WEEK, "min_total": 500.0}
OCTOBER_OVER_1000 = {"placed_from": "2026-10-01", "placed_to": "2026-10-31", "min_total": 1000.0}
WEEK_IDS = ["9101", "9104", "9105", "9107", "9108", "9111", "9112", "9114"]
EXPORTED = ["9104", "9107", "9111"]
BIG_OCTOBER = ["9097", "9107", "9118"]

# Before each turn's model call: queue what the "model" will say (the scripted provider).
Script = Callable[[int], Awaitable[None]]


@pytest_asyncio.fixture
async def dana_token(sessions: Database) -> str:
    async with sessions() as db:
        token = await create_token(db, tenant_id="northwind", user_id="cust_4410")
        await db.commit()
        return token


@pytest_asyncio.fixture(scope="module")
async def backend() -> AsyncIterator[tuple[str, httpx.AsyncClient]]:
    """A Northwind backend of this module's own: its clock at the demo's Wednesday, and its
    email service holding only Dana's emails (other tests count theirs on the shared one)."""
    async with serve(create_backend()) as url, httpx.AsyncClient(base_url=url) as client:
        yield url, client


def tool_results(messages: list[dict[str, Any]], after_seq: int) -> list[tuple[str, Any]]:
    """(tool name, its arguments) of every tool call made after `after_seq`."""
    return [
        (call["name"], call["arguments"])
        for m in messages
        if m["role"] == "assistant" and m["seq"] > after_seq
        for call in m.get("tool_calls") or []
    ]


async def five_turns(
    dana: ParleyClient, northwind: httpx.AsyncClient, script: Script | None = None
) -> list[str]:
    """Run the five turns; check the tool calls, the card and the email at each step; return
    the five answers."""
    sid = await dana.new_session()
    answers: list[str] = []

    async def turn(n: int, text: str) -> list[Any]:
        if script is not None:
            await script(n)
        seq = (await dana.session_view(sid))["last_seq"]
        _, events = await dana.turn(sid, text)
        return [events, tool_results(await dana.messages(sid), seq)]

    # 1. A search with last week's dates, worked out by the server; identity from the session.
    events, calls = await turn(1, "Show me my orders from last week.")
    assert calls == [("search_orders", LAST_WEEK)]
    answers.append(reply(events))

    # 2. Refines that set: same dates, strictly over 500.
    events, calls = await turn(2, "Just the ones over $500.")
    assert calls == [("search_orders", OVER_500)]
    answers.append(reply(events))

    # 3. Export "those": a card naming the file and its rows; nothing sent before the confirm.
    emails_before = len(await emails(northwind))
    if script is not None:
        await script(3)
    posted = await dana.post(sid, "Export those as CSV.")
    assert posted.status_code == 202, posted.text
    export_turn = posted.json()["turn_id"]
    events = await dana.events(sid, export_turn)
    assert events[-1].type == "confirmation_required", [e.type for e in events]
    action = events[-1].data["action"]
    assert action["recipient_masked"] == "d***@example.com"
    assert action["attachment"] == {"name": "orders.csv", "rows": 3}
    assert [c[0] for c in tool_results(await dana.messages(sid), 0)][-1] == "propose_orders_csv"
    assert len(await emails(northwind)) == emails_before
    confirm = f"/v1/sessions/{sid}/actions/{action['id']}/confirm"
    assert (await dana.http.post(confirm)).status_code == 202
    rest = await dana.events(sid, export_turn, last_event_id=events[-1].id)
    answers.append(reply(rest))
    again = await dana.http.post(confirm)  # a second confirm sends nothing more
    assert again.status_code == 409 and again.json()["error"]["code"] == "action_resolved"
    sent = await emails(northwind, action_id=action["id"])
    assert len(sent) == 1 and len(await emails(northwind)) == emails_before + 1
    assert sent[0]["to"] == "dana@example.com"
    [attachment] = sent[0]["attachments"]
    assert attachment["filename"] == "orders.csv" and attachment["content_type"] == "text/csv"
    rows = list(csv.DictReader(io.StringIO(attachment["content"])))
    assert [r["order_id"] for r in rows] == EXPORTED  # 9114 is exactly 500.00: not over
    assert list(rows[0]) == ["order_id", "placed", "total", "status"]
    assert rows[2] == {"order_id": "9111", "placed": "2026-10-23", "total": "515.50",
                       "status": "delivered"}  # fmt: skip

    # 4. "Them" is the same three: no new search.
    events, calls = await turn(4, "Which of them hasn't shipped yet?")
    assert calls == []
    answers.append(reply(events))

    # 5. A new scope, not a subset of the last set.
    events, calls = await turn(5, "And everything over $1,000 in October?")
    assert calls == [("search_orders", OCTOBER_OVER_1000)]
    answers.append(reply(events))
    return answers


def ids_in(text: str) -> list[str]:
    return sorted(set(re.findall(r"\b9\d{3}\b", text)))


async def test_danas_five_turns_with_the_demo_model(
    settings: Settings,
    temporal_client: Client,
    sessions: Database,
    backend: tuple[str, httpx.AsyncClient],
    dana_token: str,
) -> None:
    url, northwind = backend
    model = DemoModel(token_delay_s=0)
    async with own_stack(
        temporal_client, settings, sessions, model, prefix="dana-demo", northwind_url=url
    ) as running:
        dana = ParleyClient(running.url, dana_token)
        try:
            answers = await five_turns(dana, northwind)
        finally:
            await dana.aclose()
    first, second, sent, unshipped, october = answers
    assert ids_in(first) == WEEK_IDS
    assert ids_in(second) == EXPORTED  # 9114 (exactly 500.00) is not over
    assert "orders.csv with 3 rows" in sent and "d***@example.com" in sent
    assert ids_in(unshipped.split(":")[-1]) == ["9107"] and "processing" in unshipped
    assert "Of those 3 orders (9104, 9107 and 9111)" in unshipped
    assert ids_in(october) == BIG_OCTOBER


def state_of(body: dict[str, Any]) -> dict[str, Any]:
    state = read_state_block(request_from_openai(body).messages)
    assert state is not None
    return state


@pytest_asyncio.fixture(scope="module")
async def scripted(
    settings: Settings,
    temporal_client: Client,
    sessions: Database,
    backend: tuple[str, httpx.AsyncClient],
) -> AsyncIterator[tuple[FakeProvider, str]]:
    fake = FakeProvider()
    async with serve(fake.app) as fake_url:
        provider = OpenAICompatProvider(
            base_url=fake_url + "/v1",
            api_key="test-key",
            timeouts=Timeouts(connect_s=2.0, first_token_s=5.0, total_s=30.0),
        )
        async with own_stack(
            temporal_client,
            settings,
            sessions,
            provider,
            prefix="dana",
            model_provider="openai",
            model="scripted-model",
            northwind_url=backend[0],
            # No rolling summary: it would take a scripted reply meant for a turn.
            summary_min_new_tokens=10**9,
        ) as running:
            yield fake, running.url
        await provider.aclose()


async def test_danas_five_turns_with_a_scripted_provider(
    scripted: tuple[FakeProvider, str],
    dana_token: str,
    backend: tuple[str, httpx.AsyncClient],
) -> None:
    """The "model" only repeats what the server's state block and the tool results tell it;
    the server computed every query and kept every referent."""
    fake, url = scripted
    fake.reset()
    seen: dict[int, int] = {}

    def call(name: str, arguments: dict[str, Any]) -> Reply:
        return Reply(tool_calls=[ToolCall(name=name, arguments=json.dumps(arguments))])

    def last_result_set_id() -> str:
        found = re.findall(r"rs_[0-9a-f]{24}", json.dumps(fake.requests[-1].body))
        return found[-1]

    async def script(n: int) -> None:
        seen[n] = len(fake.requests)
        if n == 1:
            fake.script(call("search_orders", LAST_WEEK), Reply(text="Here they are."))
        elif n == 2:
            fake.script(call("search_orders", OVER_500), Reply(text="Those over $500."))
        elif n == 3:
            export = call("propose_orders_csv", {"result_set_id": last_result_set_id()})
            fake.script(export, Reply(text="Please confirm."), Reply(text="Sent."))
        elif n == 4:
            fake.script(Reply(text="One of them."))
        else:
            fake.script(call("search_orders", OCTOBER_OVER_1000), Reply(text="Three."))

    dana = ParleyClient(url, dana_token)
    try:
        await five_turns(dana, backend[1], script)
    finally:
        await dana.aclose()

    def first_state(n: int) -> dict[str, Any]:
        return state_of(fake.requests[seen[n]].body)["resolution"]["result_set"]

    # What the provider was told before it chose each step: the query, or the referent.
    assert first_state(1)["kind"] == "new" and first_state(1)["query"] == LAST_WEEK
    assert first_state(2)["kind"] == "refine" and first_state(2)["query"] == OVER_500
    assert first_state(3)["kind"] == "referent" and first_state(3)["order_ids"] == EXPORTED
    assert first_state(4)["order_ids"] == EXPORTED
    assert [r["status"] for r in first_state(4)["rows"]] == ["shipped", "processing", "delivered"]
    assert first_state(5)["kind"] == "new" and first_state(5)["query"] == OCTOBER_OVER_1000
    # The search results the provider read name exactly the right orders.
    week = json.dumps(fake.requests[seen[1] + 1].body)
    assert sorted(set(re.findall(r'order_id\\\\?": \\\\?"(9\d{3})', week))) == WEEK_IDS
