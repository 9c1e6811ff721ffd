"""Whole turns through the real provider SDKs against a local server speaking each provider's
streaming wire format: the same tool calls and the same stored messages as the demo model,
and each kind of provider fault handled where the issue says."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
import pytest_asyncio
from sqlalchemy import select
from temporalio.client import Client

from parley.config import Settings
from parley.gateway.anthropic import AnthropicProvider
from parley.gateway.base import ModelProvider
from parley.gateway.demo import DemoModel
from parley.gateway.errors import Timeouts
from parley.gateway.fake_provider.server import Fail, FakeProvider, Reply, ToolCall
from parley.gateway.openai_compat import OpenAICompatProvider
from parley.store.db import Database
from parley.store.models import ModelCall, TraceSpan
from parley.store.models import ToolCall as StoredToolCall
from tests.support.client import ParleyClient, streamed_text
from tests.support.orm import orm
from tests.support.stack import serve
from tests.support.toolkit import own_stack

TIMEOUTS = Timeouts(connect_s=2.0, first_token_s=1.5, total_s=30.0)

CONVERSATION = [
    "Where is my order?",
    "What about the refund?",
    "Thanks. And the other one?",
    "The order. Can I still return it?",
    "When did it arrive?",
]


@dataclass
class Stack:
    dialect: str
    fake: FakeProvider
    url: str
    settings: Settings  # the worker reads its fallback setting per call


def provider_for(dialect: str, base_url: str) -> ModelProvider:
    if dialect == "openai":
        return OpenAICompatProvider(
            base_url=base_url + "/v1", api_key="test-key", timeouts=TIMEOUTS
        )
    return AnthropicProvider(base_url=base_url, api_key="test-key", timeouts=TIMEOUTS)


@pytest_asyncio.fixture(scope="module", params=["openai", "anthropic"])
async def stack(
    request: pytest.FixtureRequest,
    settings: Settings,
    temporal_client: Client,
    sessions: Database,
) -> AsyncIterator[Stack]:
    dialect = request.param
    fake = FakeProvider(brain=True)
    async with serve(fake.app) as fake_url:
        provider = provider_for(dialect, fake_url)
        fallback = DemoModel(token_delay_s=0)
        async with own_stack(
            temporal_client,
            settings,
            sessions,
            provider,
            prefix=dialect,
            fallback=fallback,
            model_provider=dialect,
            model=f"{dialect}-test-model",
            fallback_model_provider="demo",
            fallback_model="demo-1",
            # No rolling summary: its model call, 1.5 s after a test's turns, would take the
            # reply the next test scripted for its own turn (the fake answers in order).
            summary_min_new_tokens=1_000_000,
        ) as running:
            yield Stack(dialect, fake, running.url, running.settings)
        await provider.aclose()  # type: ignore[attr-defined]


@pytest_asyncio.fixture
async def client(stack: Stack, tokens: dict[str, str]) -> AsyncIterator[ParleyClient]:
    stack.fake.reset()
    stack.fake.brain = True
    c = ParleyClient(stack.url, tokens["priya"])
    yield c
    await c.aclose()


def canonical(messages: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """The stored transcript, less the ids minted per run (pending action ids)."""
    return [
        (
            m["seq"],
            m["role"],
            m["status"],
            re.sub(r"act_\w+", "act_*", m["text"]),
            m.get("tool_calls"),
            m.get("tool_call_id"),
        )
        for m in messages
    ]


async def converse(client: ParleyClient) -> list[dict[str, Any]]:
    sid = await client.new_session()
    for text in CONVERSATION[:2]:
        _, events = await client.turn(sid, text)
        assert events[-1].type == "done", [e.type for e in events]
    posted = await client.post(sid, "Can you email me?")
    turn_id = posted.json()["turn_id"]
    events = await client.events(sid, turn_id)
    assert events[-1].type == "confirmation_required"
    action = events[-1].data["action"]["id"]
    assert (
        await client.http.post(f"/v1/sessions/{sid}/actions/{action}/confirm")
    ).status_code == 202
    rest = await client.events(sid, turn_id, last_event_id=events[-1].id)
    assert rest[-1].type == "done"
    for text in CONVERSATION[2:]:
        _, events = await client.turn(sid, text)
        assert events[-1].type == "done"
    return await client.messages(sid)


async def test_the_conversation_through_the_sdk_stores_what_the_demo_model_stores(
    stack: Stack, client: ParleyClient, priya: ParleyClient
) -> None:
    through_sdk = await converse(client)
    with_demo = await converse(priya)  # the session worker: the built-in demo model
    assert canonical(through_sdk) == canonical(with_demo)
    names = [c["name"] for m in through_sdk for c in m.get("tool_calls") or []]
    assert names == [
        "list_open_orders",
        "get_refund",
        "propose_email",
        "check_return_eligibility",
        "get_order",
    ]
    # The provider really was spoken to, in its own wire format, with tools.
    bodies = [r.body for r in stack.fake.requests]
    assert bodies and all(b["stream"] is True for b in bodies)
    assert all(b["model"] == f"{stack.dialect}-test-model" for b in bodies)
    if stack.dialect == "anthropic":
        assert bodies[0]["system"][0]["cache_control"] == {"type": "ephemeral"}
        assert {"name", "input_schema"} <= set(bodies[0]["tools"][0])
    else:
        assert bodies[0]["tools"][0]["type"] == "function"
        assert bodies[0]["stream_options"] == {"include_usage": True}


async def model_calls(sessions: Database, turn_id: str) -> list[ModelCall]:
    async with orm(sessions) as db:
        return list(await db.scalars(select(ModelCall).where(ModelCall.turn_id == turn_id)))


async def spans(sessions: Database, turn_id: str, name: str = "call_model") -> list[TraceSpan]:
    async with orm(sessions) as db:
        return list(
            await db.scalars(
                select(TraceSpan)
                .where(TraceSpan.turn_id == turn_id, TraceSpan.name == name)
                .order_by(TraceSpan.started_at)
            )
        )


async def test_usage_is_stored_with_the_model_call(
    stack: Stack, client: ParleyClient, sessions: Database
) -> None:
    stack.fake.script(
        Reply(text="Hello there.", input_tokens=40, output_tokens=3, cached_tokens=32)
    )
    sid = await client.new_session()
    turn_id, events = await client.turn(sid, "Hi")
    assert events[-1].type == "done"
    [call] = await model_calls(sessions, turn_id)
    assert call.usage == {"input_tokens": 40, "output_tokens": 3, "cached_tokens": 32}
    assert call.provider == stack.dialect and call.first_token_ms is not None


async def test_every_step_leaves_one_span_and_the_model_call_names_its_model(
    stack: Stack, client: ParleyClient, sessions: Database
) -> None:
    stack.fake.script(Reply(text="Hello there.", input_tokens=40, output_tokens=3))
    sid = await client.new_session()
    turn_id, events = await client.turn(sid, "Hi")
    assert events[-1].type == "done"
    # The finishing step's span is written after its commit, so after `done` went out.
    deadline = time.monotonic() + 10
    while not await spans(sessions, turn_id, "finish_turn"):
        assert time.monotonic() < deadline, "finish_turn left no span"
        await asyncio.sleep(0.05)
    for step in ("screen_input", "build_context", "call_model", "finish_turn"):
        [span] = await spans(sessions, turn_id, step)
        assert (span.attempt, span.outcome) == (1, "ok"), step
        assert span.started_at <= span.ended_at
    [model] = await spans(sessions, turn_id)
    assert model.attrs is not None
    assert model.attrs["provider"] == stack.dialect and model.attrs["fallback"] is False
    assert model.attrs["model"] == f"{stack.dialect}-test-model"
    assert model.attrs["usage"]["output_tokens"] == 3 and model.attrs["total_ms"] > 0
    [screen] = await spans(sessions, turn_id, "screen_input")
    assert screen.attrs == {"allowed": True, "category": None}


async def test_429_is_retried_after_its_retry_after(
    stack: Stack, client: ParleyClient, sessions: Database
) -> None:
    stack.fake.script(Fail(status=429, retry_after="2"))
    sid = await client.new_session()
    turn_id, events = await client.turn(sid, "Hi")
    assert events[-1].type == "done"
    first, second = await spans(sessions, turn_id)
    assert first.outcome != "ok" and second.outcome == "ok"
    gap = (second.started_at - first.ended_at).total_seconds()
    assert gap >= 1.8, gap  # the server's 2 s, not the policy's 0.5 s first interval


async def test_500_is_retried_with_backoff(
    stack: Stack, client: ParleyClient, sessions: Database
) -> None:
    stack.fake.script(Fail(status=500), Fail(status=500))
    sid = await client.new_session()
    turn_id, events = await client.turn(sid, "Hi")
    assert events[-1].type == "done"
    attempts = await spans(sessions, turn_id)
    assert [s.outcome == "ok" for s in attempts] == [False, False, True]
    gaps = [
        (b.started_at - a.ended_at).total_seconds()
        for a, b in zip(attempts, attempts[1:], strict=False)
    ]
    assert gaps[1] > gaps[0]  # backing off


async def test_400_is_not_retried_and_is_reported(
    stack: Stack, client: ParleyClient, sessions: Database
) -> None:
    stack.fake.script(Fail(status=400))
    sid = await client.new_session()
    turn_id, events = await client.turn(sid, "Hi")
    assert events[-1].type == "error"
    assert events[-1].data["code"] == "bad_request"
    assert events[-1].data["retryable"] is False
    assert len(await spans(sessions, turn_id)) == 1  # no retry, and no fallback either
    assert len(stack.fake.requests) == 1


async def test_a_stall_hits_the_first_token_timeout_and_is_retried(
    stack: Stack, client: ParleyClient, sessions: Database
) -> None:
    stack.fake.script(Reply(brain=True, stall_s=4.0))
    sid = await client.new_session()
    started = time.monotonic()
    turn_id, events = await client.turn(sid, "Hi")
    assert events[-1].type == "done"
    first, second = (await spans(sessions, turn_id))[:2]
    assert first.outcome != "ok" and second.outcome == "ok"
    assert (first.ended_at - first.started_at).total_seconds() < 3.5  # timed out, did not wait
    assert time.monotonic() - started < 10


async def test_a_drop_mid_stream_is_retried_with_a_reset_and_the_answer_shown_once(
    stack: Stack, client: ParleyClient
) -> None:
    stack.fake.script(Reply(brain=True, drop_after=4))
    sid = await client.new_session()
    _, events = await client.turn(sid, "Tell me about yourself")
    assert events[-1].type == "done"
    kinds = [e.type for e in events]
    assert "reset" in kinds and kinds.index("reset") > kinds.index("delta")
    assert streamed_text(events) == events[-1].data["message"]["text"]


async def test_a_drop_that_persists_leaves_incomplete_text_and_a_retryable_error(
    stack: Stack, client: ParleyClient
) -> None:
    stack.fake.brain = False
    stack.fake.script(*[Reply(text="Part of an answer that never ends", drop_after=3)] * 5)
    stack.settings.fallback_model_provider = ""  # a deployment without a fallback model
    try:
        sid = await client.new_session()
        _, events = await client.turn(sid, "Hi")
    finally:
        stack.settings.fallback_model_provider = "demo"
    assert events[-1].type == "error"
    assert events[-1].data["retryable"] is True
    shown = streamed_text(events)
    assert shown == "Part of an "  # three deltas, then the connection closed
    [answer] = [m for m in await client.messages(sid) if m["role"] == "assistant"]
    assert (answer["status"], answer["text"]) == ("incomplete", shown)


async def test_malformed_tool_arguments_go_back_to_the_model_as_a_structured_error(
    stack: Stack, client: ParleyClient, sessions: Database
) -> None:
    stack.fake.script(Reply(tool_calls=[ToolCall(name="get_order", arguments='{"order_id": "84')]))
    sid = await client.new_session()
    turn_id, events = await client.turn(sid, "Where is my order?")
    assert events[-1].type == "done"
    messages = await client.messages(sid)
    assert [m["tool"]["status"] for m in messages if m["role"] == "tool"] == ["error"]
    async with orm(sessions) as db:
        results = list(
            await db.scalars(select(StoredToolCall.result).where(StoredToolCall.turn_id == turn_id))
        )
    assert len(results) == 1 and "invalid_arguments" in str(results[0])
    assert "went wrong" in events[-1].data["message"]["text"]


async def test_the_fallback_model_answers_when_the_primary_is_down(
    stack: Stack, client: ParleyClient, sessions: Database
) -> None:
    stack.fake.brain = False
    stack.fake.script(*[Fail(status=503)] * 5)
    sid = await client.new_session()
    turn_id, events = await client.turn(sid, "Tell me about yourself")
    assert events[-1].type == "done"
    assert "orders" in events[-1].data["message"]["text"]
    attempts = await spans(sessions, turn_id)
    primary = [s for s in attempts if s.attrs and s.attrs["provider"] == stack.dialect]
    fallback = [s for s in attempts if s.attrs and s.attrs["provider"] == "demo"]
    assert len(primary) == 5 and all(s.outcome != "ok" for s in primary)
    assert len(fallback) == 1 and fallback[0].outcome == "ok"
    assert fallback[0].attrs is not None and fallback[0].attrs["fallback"] is True
    [call] = await model_calls(sessions, turn_id)
    assert (call.provider, call.model) == ("demo", "demo-1")
