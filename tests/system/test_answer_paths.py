"""Answer paths by turn shape (parley/paths.py), through the public API and a local server
speaking OpenAI's streaming format: a turn with no tools available asks the provider for a
grounded answer at low reasoning effort, a tool turn at the tenant's effort, and a tool off
the allow-list is refused even when a provider asks for it."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest_asyncio
from sqlalchemy import select
from temporalio.client import Client

from parley.config import Settings
from parley.gateway.demo import NO_TOOLS_TEXT
from parley.gateway.errors import Timeouts
from parley.gateway.fake_provider.server import FakeProvider, Reply, ToolCall
from parley.gateway.openai_compat import OpenAICompatProvider
from parley.store import tenants
from parley.store.db import Database
from parley.store.models import ToolCall as StoredToolCall
from parley.store.models import TraceSpan
from parley.tenancy import TenantConfig
from tests.support.client import ParleyClient
from tests.support.orm import orm
from tests.support.stack import serve
from tests.support.toolkit import model_calls, own_stack, reply

TIMEOUTS = Timeouts(connect_s=2.0, first_token_s=5.0, total_s=30.0)


@pytest_asyncio.fixture(scope="module")
async def fake_and_client(
    settings: Settings,
    temporal_client: Client,
    sessions: Database,
    tokens: dict[str, str],
) -> AsyncIterator[tuple[FakeProvider, ParleyClient]]:
    fake = FakeProvider(brain=True)
    async with serve(fake.app) as fake_url:
        provider = OpenAICompatProvider(
            base_url=fake_url + "/v1", api_key="test-key", timeouts=TIMEOUTS
        )
        async with own_stack(
            temporal_client,
            settings,
            sessions,
            provider,
            prefix="paths",
            model_provider="openai",
            model="openai-test-model",
        ) as stack:
            client = ParleyClient(stack.url, tokens["priya"])
            try:
                yield fake, client
            finally:
                await client.aclose()
        await provider.aclose()


@asynccontextmanager
async def northwind_config(sessions: Database, **config: Any) -> AsyncIterator[None]:
    """Northwind's tenant config set to `config` for the block, then restored."""
    async with sessions() as db:
        saved = TenantConfig.model_validate(
            (await tenants.get_tenant(db, tenant_id="northwind")).config or {}
        )
        await tenants.set_config(db, tenant_id="northwind", config=TenantConfig(**config))
        await db.commit()
    try:
        yield
    finally:
        async with sessions() as db:
            await tenants.set_config(db, tenant_id="northwind", config=saved)
            await db.commit()


async def test_a_turn_with_no_tools_takes_the_fast_grounded_path_at_low_effort(
    fake_and_client: tuple[FakeProvider, ParleyClient],
    sessions: Database,
) -> None:
    fake, client = fake_and_client
    fake.reset()
    async with northwind_config(sessions, tool_allowlist=[], reasoning_effort="high"):
        sid = await client.new_session()
        turn_id, events = await client.turn(sid, "What is your policy on damaged items?")
        # Grounded: the answer quotes the tenant's policy passage and cites it.
        assert events[-1].type == "done"
        answer = reply(events)
        assert "damaged" in answer.lower() and "[K1]" in answer
        # An order question cannot be looked up: the answer says so instead of guessing.
        order_turn, order_events = await client.turn(sid, "Where is my order 8472?")
        assert reply(order_events) == NO_TOOLS_TEXT

    bodies = [r.body for r in fake.requests]
    assert len(bodies) == 2  # one request per turn: no tool loop
    for body in bodies:
        assert "tools" not in body
        assert body["reasoning_effort"] == "low"  # not the tenant's "high"
        system = " ".join(m["content"] for m in body["messages"] if m["role"] == "system")
        assert "No tools are available in this conversation" in system
    [call] = await model_calls(sessions, turn_id)
    assert call.request["path"] == "fast"
    async with orm(sessions) as db:
        span = await db.scalar(
            select(TraceSpan).where(TraceSpan.turn_id == order_turn, TraceSpan.name == "call_model")
        )
    assert span is not None and span.attrs is not None and span.attrs["path"] == "fast"


async def test_a_tool_turn_runs_the_loop_at_the_tenants_effort(
    fake_and_client: tuple[FakeProvider, ParleyClient],
    sessions: Database,
) -> None:
    fake, client = fake_and_client
    fake.reset()
    async with northwind_config(
        sessions, tool_allowlist=["list_open_orders", "get_order"], reasoning_effort="high"
    ):
        sid = await client.new_session()
        turn_id, events = await client.turn(sid, "Where is my order?")
    assert events[-1].type == "done"
    bodies = [r.body for r in fake.requests]
    assert len(bodies) >= 2  # a lookup, then the answer
    for body in bodies:
        assert [t["function"]["name"] for t in body["tools"]] == ["list_open_orders", "get_order"]
        assert body["reasoning_effort"] == "high"
        system = " ".join(m["content"] for m in body["messages"] if m["role"] == "system")
        assert "No tools are available" not in system
    assert {c.request["path"] for c in await model_calls(sessions, turn_id)} == {"tools"}


async def test_a_tool_off_the_allow_list_is_refused_even_when_the_provider_asks_for_it(
    fake_and_client: tuple[FakeProvider, ParleyClient],
    sessions: Database,
) -> None:
    fake, client = fake_and_client
    fake.reset()
    arguments = json.dumps({"order_id": "8472", "template": "order_status_summary"})
    fake.script(
        Reply(tool_calls=[ToolCall(name="propose_email", arguments=arguments)]),
        Reply(text="I can't send email from here."),
    )
    async with northwind_config(sessions, tool_allowlist=["get_order"]):
        sid = await client.new_session()
        turn_id, events = await client.turn(sid, "Please email me the status of order 8472.")
    assert events[-1].type == "done"
    assert not [e for e in events if e.type == "confirmation_required"]
    async with orm(sessions) as db:
        results = list(
            await db.scalars(select(StoredToolCall.result).where(StoredToolCall.turn_id == turn_id))
        )
    assert [r["error"]["code"] for r in results] == ["not_allowed"]
    # The user's view names the tool and its status, never the result behind it.
    shown = [m for m in await client.messages(sid) if m["role"] == "tool"][-1]
    assert shown["tool"]["status"] == "error" and "not_allowed" not in json.dumps(shown)
