"""The provider adapters through the real SDKs, against the fake provider over real HTTP."""

from __future__ import annotations

import json
import pickle
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from email.utils import formatdate
from typing import Any

import pytest
import pytest_asyncio

from parley.config import Settings
from parley.context import state_block
from parley.gateway.anthropic import AnthropicProvider, to_anthropic_messages
from parley.gateway.base import (
    Finish,
    ModelProvider,
    ModelRequest,
    OutputSchema,
    TextDelta,
    ToolCallRequest,
)
from parley.gateway.demo import DemoModel
from parley.gateway.errors import (
    ProviderFatal,
    ProviderRetryable,
    Timeouts,
    retry_after_seconds,
)
from parley.gateway.fake_provider.server import (
    Fail,
    FakeProvider,
    Reply,
    ToolCall,
    anthropic_refusal,
    awkward_pieces,
    request_from_anthropic,
    request_from_openai,
)
from parley.gateway.openai_compat import OpenAICompatProvider, to_openai_messages
from parley.gateway.registry import build_provider
from parley.window import group_turns, render_turn
from tests.support.stack import serve

DIALECTS = ["openai", "anthropic"]
OPENAI_KEY = "sk-test-openai-1234"
ANTHROPIC_KEY = "sk-ant-test-5678"
FAST = Timeouts(connect_s=2.0, first_token_s=2.0, total_s=10.0)

# Arguments that break careless reassembly: escapes, a surrogate pair written as escapes,
# raw non-ASCII, nested structures.
NASTY_ARGS = json.dumps(
    {
        "order_id": "NW-1001",
        "note": 'say "hi" \\ then\nnewline, tab\t, café, 東京, 😀',
        "nested": {"list": [1, 2.5, None, True], "empty": {}},
    }
)
ASCII_ARGS = json.dumps({"quote": 'a "b" \\ é 😀'}, ensure_ascii=True)


@pytest_asyncio.fixture(scope="module")
async def fake_server() -> AsyncIterator[tuple[FakeProvider, str]]:
    fake = FakeProvider()
    async with serve(fake.app) as url:
        yield fake, url


@pytest.fixture
def fake(fake_server: tuple[FakeProvider, str]) -> FakeProvider:
    fake_server[0].reset()
    fake_server[0].brain = False
    return fake_server[0]


@pytest.fixture
def url(fake_server: tuple[FakeProvider, str]) -> str:
    return fake_server[1]


def provider(dialect: str, url: str, timeouts: Timeouts = FAST) -> ModelProvider:
    if dialect == "openai":
        return OpenAICompatProvider(base_url=f"{url}/v1", api_key=OPENAI_KEY, timeouts=timeouts)
    return AnthropicProvider(base_url=url, api_key=ANTHROPIC_KEY, timeouts=timeouts)


def simple_request(text: str = "Hello") -> ModelRequest:
    return ModelRequest(
        model="fake-model",
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": text}],
    )


async def collect(p: ModelProvider, request: ModelRequest) -> list[Any]:
    return [event async for event in p.stream(request)]


# --- streaming -----------------------------------------------------------------------------


@pytest.mark.parametrize("dialect", DIALECTS)
async def test_text_deltas_arrive_as_they_are_sent(
    dialect: str, fake: FakeProvider, url: str
) -> None:
    fake.script(Reply(text=["Hel", "lo", " wor", "ld"], delay_s=0.15))
    arrivals: list[tuple[float, str]] = []
    events = []
    async for event in provider(dialect, url).stream(simple_request()):
        events.append(event)
        if isinstance(event, TextDelta):
            arrivals.append((time.monotonic(), event.text))
    assert [text for _, text in arrivals] == ["Hel", "lo", " wor", "ld"]
    # Had the adapter buffered the stream, every delta would arrive at the end together.
    assert arrivals[-1][0] - arrivals[0][0] >= 0.3
    assert events[-1] == Finish(
        "stop", {"input_tokens": 21, "output_tokens": 7, "cached_tokens": 0}
    )
    assert sum(isinstance(e, Finish) for e in events) == 1


@pytest.mark.parametrize("dialect", DIALECTS)
async def test_tool_calls_are_reassembled_from_fragments(
    dialect: str, fake: FakeProvider, url: str
) -> None:
    assert len(awkward_pieces(NASTY_ARGS)) > 10
    fake.script(
        Reply(
            text=["Let me ", "check."],
            tool_calls=[
                ToolCall(id="call_a", name="get_order", arguments=NASTY_ARGS),
                ToolCall(id="call_b", name="lookup", arguments=ASCII_ARGS),
            ],
        )
    )
    events = await collect(provider(dialect, url), simple_request())
    assert events == [
        TextDelta("Let me "),
        TextDelta("check."),
        ToolCallRequest("call_a", "get_order", NASTY_ARGS),
        ToolCallRequest("call_b", "lookup", ASCII_ARGS),
        Finish("tool_calls", {"input_tokens": 21, "output_tokens": 7, "cached_tokens": 0}),
    ]


@pytest.mark.parametrize("dialect", DIALECTS)
async def test_usage_includes_cached_tokens(dialect: str, fake: FakeProvider, url: str) -> None:
    fake.script(Reply(text=["ok"], input_tokens=1500, output_tokens=3, cached_tokens=1024))
    events = await collect(provider(dialect, url), simple_request())
    assert events[-1] == Finish(
        "stop", {"input_tokens": 1500, "output_tokens": 3, "cached_tokens": 1024}
    )


@pytest.mark.parametrize("dialect", DIALECTS)
async def test_length_finish(dialect: str, fake: FakeProvider, url: str) -> None:
    fake.script(Reply(text=["cut"], finish="length"))
    events = await collect(provider(dialect, url), simple_request())
    assert isinstance(events[-1], Finish) and events[-1].reason == "length"


@pytest.mark.parametrize("dialect", DIALECTS)
async def test_malformed_tool_arguments_pass_through_raw(
    dialect: str, fake: FakeProvider, url: str
) -> None:
    broken = '{"order_id": "NW-1001", "note": "unterminated'
    fake.script(Reply(tool_calls=[ToolCall(id="call_x", name="get_order", arguments=broken)]))
    events = await collect(provider(dialect, url), simple_request())
    assert events[0] == ToolCallRequest("call_x", "get_order", broken)
    assert isinstance(events[-1], Finish) and events[-1].reason == "tool_calls"


# --- the wire format -----------------------------------------------------------------------

TOOLS = [
    {
        "name": "get_order",
        "description": "Look up one order.",
        "parameters": {
            "type": "object",
            "properties": {"order_id": {"type": "string"}},
            "required": ["order_id"],
        },
    }
]

CONVERSATION: list[dict[str, Any]] = [
    {"role": "system", "content": "You are the Northwind assistant."},
    {"role": "system", "content": "Conversation state, written by the server: {}"},
    {"role": "user", "content": "Where are my orders?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": "call_1", "name": "get_order", "arguments": {"order_id": "NW-1001"}},
            {"id": "call_2", "name": "get_order", "arguments": '{"order_id": "NW-10'},
        ],
    },
    {
        "role": "tool",
        "tool_call_id": "call_1",
        "content": json.dumps({"name": "get_order", "result": {"status": "shipped"}}),
    },
    {
        "role": "tool",
        "tool_call_id": "call_2",
        "content": json.dumps({"name": "get_order", "result": {"error": {"code": "bad_args"}}}),
    },
    {"role": "assistant", "content": "Order NW-1001 has shipped."},
    {"role": "user", "content": "Thanks!"},
]


async def test_openai_wire_format(fake: FakeProvider, url: str) -> None:
    fake.script(Reply(text=["ok"]))
    request = ModelRequest("gpt-test", CONVERSATION, TOOLS, max_output_tokens=256)
    await collect(provider("openai", url), request)
    (seen,) = fake.requests
    assert seen.path == "/v1/chat/completions"
    assert seen.headers["authorization"] == "***" + OPENAI_KEY[-4:]
    body = seen.body
    # Exactly the request, each field once (it goes as the SDK's extra body fields).
    assert sorted(body) == [
        "max_completion_tokens",
        "messages",
        "model",
        "stream",
        "stream_options",
        "tools",
    ]
    assert body["model"] == "gpt-test"
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert body["max_completion_tokens"] == 256
    assert body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "get_order",
                "description": "Look up one order.",
                "parameters": TOOLS[0]["parameters"],
            },
        }
    ]
    assert body["messages"] == [
        {"role": "system", "content": "You are the Northwind assistant."},
        {"role": "system", "content": "Conversation state, written by the server: {}"},
        {"role": "user", "content": "Where are my orders?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_order", "arguments": '{"order_id": "NW-1001"}'},
                },
                {
                    "id": "call_2",
                    "type": "function",
                    "function": {"name": "get_order", "arguments": '{"order_id": "NW-10'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": CONVERSATION[4]["content"]},
        {"role": "tool", "tool_call_id": "call_2", "content": CONVERSATION[5]["content"]},
        {"role": "assistant", "content": "Order NW-1001 has shipped."},
        {"role": "user", "content": "Thanks!"},
    ]


async def test_anthropic_wire_format(fake: FakeProvider, url: str) -> None:
    fake.script(Reply(text=["ok"]))
    messages = [*CONVERSATION, {"role": "user", "content": "One more thing."}]
    request = ModelRequest("claude-test", messages, TOOLS, max_output_tokens=256)
    await collect(provider("anthropic", url), request)
    (seen,) = fake.requests
    assert seen.path == "/v1/messages"
    # The SDK sends the key as `x-api-key` or, in recent versions, as a bearer token.
    key = seen.headers.get("x-api-key") or seen.headers["authorization"]
    assert key == "***" + ANTHROPIC_KEY[-4:]
    assert "anthropic-version" in seen.headers
    body = seen.body
    assert body["model"] == "claude-test"
    assert body["stream"] is True
    assert body["max_tokens"] == 256
    assert body["system"] == [
        {
            "type": "text",
            "text": "You are the Northwind assistant.",
            "cache_control": {"type": "ephemeral"},
        },
        {"type": "text", "text": "Conversation state, written by the server: {}"},
    ]
    assert body["tools"] == [
        {
            "name": "get_order",
            "description": "Look up one order.",
            "input_schema": TOOLS[0]["parameters"],
        }
    ]
    assert body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "Where are my orders?"}]},
        {
            "role": "assistant",
            "content": [
                {
                    "type": "tool_use",
                    "id": "call_1",
                    "name": "get_order",
                    "input": {"order_id": "NW-1001"},
                },
                {
                    "type": "tool_use",
                    "id": "call_2",
                    "name": "get_order",
                    "input": {"_raw_arguments": '{"order_id": "NW-10'},
                },
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "call_1",
                    "content": CONVERSATION[4]["content"],
                },
                {
                    "type": "tool_result",
                    "tool_use_id": "call_2",
                    "content": CONVERSATION[5]["content"],
                },
            ],
        },
        {"role": "assistant", "content": [{"type": "text", "text": "Order NW-1001 has shipped."}]},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Thanks!"},
                {"type": "text", "text": "One more thing."},
            ],
        },
    ]
    roles = [m["role"] for m in body["messages"]]
    assert all(a != b for a, b in zip(roles, roles[1:], strict=False))


ANSWER = OutputSchema(
    name="answer",
    schema={"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
)


async def test_anthropic_structured_output_with_an_effort_is_asked_without_thinking(
    fake: FakeProvider, url: str
) -> None:
    """The Messages API refuses extended thinking beside a forced tool, and structured output
    is a forced tool there: a tenant's reasoning effort must not turn a summary into a 400."""
    fake.script(Reply(tool_calls=[ToolCall(name="answer", arguments='{"text": "ok"}')]))
    request = replace(simple_request(), output_schema=ANSWER, reasoning_effort="high")
    events = await collect(provider("anthropic", url), request)
    assert [e.arguments for e in events if isinstance(e, ToolCallRequest)] == ['{"text": "ok"}']
    (seen,) = fake.requests
    assert seen.body["tool_choice"] == {"type": "tool", "name": "answer"}
    assert "thinking" not in seen.body


async def test_anthropic_thinking_is_asked_with_a_budget_below_max_tokens(
    fake: FakeProvider, url: str
) -> None:
    fake.script(Reply(text=["ok"]))
    request = replace(simple_request(), max_output_tokens=256, reasoning_effort="medium")
    events = await collect(provider("anthropic", url), request)
    assert events[-1] == Finish("stop", events[-1].usage)
    thinking = fake.requests[0].body["thinking"]
    assert thinking["type"] == "enabled"
    assert 1024 <= thinking["budget_tokens"] < fake.requests[0].body["max_tokens"]


@pytest.mark.parametrize(
    ("body", "why"),
    [
        ({"tool_choice": {"type": "tool", "name": "x"}}, "forces tool use"),
        ({"tool_choice": {"type": "any"}}, "forces tool use"),
        ({"max_tokens": 2048}, "greater than thinking.budget_tokens"),
    ],
)
def test_the_fake_refuses_what_the_messages_api_refuses(body: dict[str, Any], why: str) -> None:
    thinking = {"type": "enabled", "budget_tokens": 2048}
    refused = anthropic_refusal({"max_tokens": 4096, "thinking": thinking, **body})
    assert refused is not None and why in refused
    assert anthropic_refusal({"max_tokens": 4096, "thinking": thinking}) is None


def test_tool_results_lead_a_merged_user_message() -> None:
    _, turns = to_anthropic_messages(
        [
            {"role": "user", "content": "Check it."},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"id": "c1", "name": "t", "arguments": {}}],
            },
            {"role": "user", "content": "Also this."},
            {"role": "tool", "tool_call_id": "c1", "content": "{}"},
        ]
    )
    assert [b["type"] for b in turns[-1]["content"]] == ["tool_result", "text"]


@pytest.mark.parametrize("dialect", DIALECTS)
def test_wire_translation_round_trips(dialect: str) -> None:
    """The fake's reverse translation recovers the canonical history (what brain mode and
    the end-to-end tests rely on)."""
    request = ModelRequest("m", CONVERSATION, TOOLS, 300)
    if dialect == "openai":
        body = {
            "model": "m",
            "messages": to_openai_messages(request.messages),
            "tools": [{"type": "function", "function": t} for t in TOOLS],
            "max_completion_tokens": 300,
        }
        back = request_from_openai(body)
    else:
        system, messages = to_anthropic_messages(request.messages)
        tools = [
            {"name": t["name"], "description": t["description"], "input_schema": t["parameters"]}
            for t in TOOLS
        ]
        body = {"model": "m", "system": system, "messages": messages, "tools": tools}
        back = request_from_anthropic({**body, "max_tokens": 300})
    assert back == request


# --- errors --------------------------------------------------------------------------------


@pytest.mark.parametrize("dialect", DIALECTS)
async def test_rate_limit_is_retryable_with_retry_after(
    dialect: str, fake: FakeProvider, url: str
) -> None:
    fake.script(Fail(status=429, retry_after="7"))
    with pytest.raises(ProviderRetryable) as caught:
        await collect(provider(dialect, url), simple_request())
    error = caught.value
    assert (error.status, error.code, error.retry_after_s) == (429, "rate_limited", 7.0)
    assert error.provider == dialect
    assert error.request_id == "req_fake"
    assert len(fake.requests) == 1  # the SDK did not retry on its own


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("status", [500, 503, 529])
async def test_server_errors_are_retryable(
    dialect: str, status: int, fake: FakeProvider, url: str
) -> None:
    fake.script(Fail(status=status))
    with pytest.raises(ProviderRetryable) as caught:
        await collect(provider(dialect, url), simple_request())
    assert (caught.value.status, caught.value.code) == (status, "server_error")
    assert len(fake.requests) == 1


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize(("status", "code"), [(400, "bad_request"), (401, "unauthorized")])
async def test_client_errors_are_fatal(
    dialect: str, status: int, code: str, fake: FakeProvider, url: str
) -> None:
    fake.script(Fail(status=status))
    with pytest.raises(ProviderFatal) as caught:
        await collect(provider(dialect, url), simple_request())
    error = caught.value
    assert (error.status, error.code, error.retry_after_s) == (status, code, None)
    # Short, and free of the key and of the provider's own words.
    assert str(error).startswith(f"{dialect} returned HTTP {status}")
    assert "scripted" not in str(error)
    assert OPENAI_KEY[-4:] not in str(error) and ANTHROPIC_KEY[-4:] not in str(error)
    assert error.__cause__ is None


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize(
    "stall",
    [
        pytest.param(Reply(text=["late"], stall_s=5.0), id="before-headers"),
        pytest.param(Reply(text=["late"], delay_s=1.5), id="after-headers"),
    ],
)
async def test_silence_is_a_first_token_timeout(
    dialect: str, stall: Reply, fake: FakeProvider, url: str
) -> None:
    fake.script(stall)
    timeouts = Timeouts(connect_s=1.0, first_token_s=0.3, total_s=10.0)
    with pytest.raises(ProviderRetryable) as caught:
        await collect(provider(dialect, url, timeouts), simple_request())
    # The reply would come (after 1.5 s or 5 s) within the 10 s total; giving up with this
    # code means the 0.3 s first-token limit cut the wait short.
    assert caught.value.code == "first_token_timeout"


@pytest.mark.parametrize("dialect", DIALECTS)
async def test_total_timeout(dialect: str, fake: FakeProvider, url: str) -> None:
    fake.script(Reply(text=list("abcdefghij"), delay_s=0.1))
    timeouts = Timeouts(connect_s=1.0, first_token_s=1.0, total_s=0.75)
    received: list[str] = []
    with pytest.raises(ProviderRetryable) as caught:
        async for event in provider(dialect, url, timeouts).stream(simple_request()):
            if isinstance(event, TextDelta):
                received.append(event.text)
    assert caught.value.code == "total_timeout"
    assert 0 < len(received) < 10


@pytest.mark.parametrize("dialect", DIALECTS)
async def test_drop_mid_stream_yields_partial_text_then_raises(
    dialect: str, fake: FakeProvider, url: str
) -> None:
    fake.script(Reply(text=["one ", "two ", "three ", "four"], drop_after=2))
    received: list[Any] = []
    with pytest.raises(ProviderRetryable) as caught:
        async for event in provider(dialect, url).stream(simple_request()):
            received.append(event)
    assert received == [TextDelta("one "), TextDelta("two ")]
    assert caught.value.code == "stream_dropped"


@pytest.mark.parametrize("dialect", DIALECTS)
async def test_a_drop_carries_the_usage_the_provider_reported_before_it(
    dialect: str, fake: FakeProvider, url: str
) -> None:
    # Anthropic reports the input at `message_start`, before any text, and bills it; OpenAI
    # reports usage only in its last chunk, which a broken stream never sends.
    fake.script(Reply(text=["one ", "two ", "three "], drop_after=1, input_tokens=321))
    with pytest.raises(ProviderRetryable) as caught:
        await collect(provider(dialect, url), simple_request())
    if dialect == "anthropic":
        assert caught.value.usage is not None and caught.value.usage["input_tokens"] == 321
    else:
        assert caught.value.usage is None


@pytest.mark.parametrize("dialect", DIALECTS)
async def test_consumer_may_stop_early(dialect: str, fake: FakeProvider, url: str) -> None:
    fake.script(Reply(text=["a", "b", "c"], delay_s=0.05), Reply(text=["again"]))
    p = provider(dialect, url)
    async for event in p.stream(simple_request()):
        assert event == TextDelta("a")
        break
    events = await collect(p, simple_request())
    assert events[0] == TextDelta("again")


async def test_connection_refused_is_retryable() -> None:
    from tests.support.stack import free_port

    dead = f"http://127.0.0.1:{free_port()}"
    for dialect in DIALECTS:
        with pytest.raises(ProviderRetryable) as caught:
            await collect(provider(dialect, dead), simple_request())
        assert caught.value.code == "connection"


def test_retry_after_forms() -> None:
    assert retry_after_seconds({"retry-after": "2.5"}) == 2.5
    assert retry_after_seconds({"retry-after-ms": "1500", "retry-after": "9"}) == 1.5
    in_a_minute = retry_after_seconds({"retry-after": formatdate(time.time() + 60, usegmt=True)})
    assert in_a_minute is not None and 55 < in_a_minute <= 60
    assert retry_after_seconds({"retry-after": "soon"}) is None
    assert retry_after_seconds({}) is None


def test_errors_survive_pickling() -> None:
    error = ProviderRetryable(
        "openai returned HTTP 429",
        provider="openai",
        code="rate_limited",
        status=429,
        retry_after_s=3.0,
    )
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is ProviderRetryable
    assert (str(copy), copy.status, copy.retry_after_s, copy.code) == (
        "openai returned HTTP 429",
        429,
        3.0,
        "rate_limited",
    )


# --- brain mode ----------------------------------------------------------------------------


def parley_request(window: list[Any] | None = None) -> ModelRequest:
    from parley.context import WindowMessage
    from parley.tools import model_tools

    turns = group_turns(window or [WindowMessage(1, "user", "Where is my order?", "complete")])
    state = {"customer": {"name": "Priya"}, "slots": {}, "resolution": {}, "action": None}
    messages = [
        {"role": "system", "content": Settings().system_prompt},
        state_block(state),
        *(
            m
            for turn in turns
            for m in render_turn(turn, aged=False, max_message_tokens=10**6, cut=lambda t, n: t)
        ),
    ]
    # The tools a turn offers: the demo model (and brain mode) calls only what it is offered.
    return ModelRequest("fake-model", messages, model_tools())


@pytest.mark.parametrize("dialect", DIALECTS)
async def test_brain_mode_answers_like_the_demo_model(
    dialect: str, fake: FakeProvider, url: str
) -> None:
    fake.brain = True
    p = provider(dialect, url)
    request = parley_request()
    events = await collect(p, request)
    demo = await collect(DemoModel(token_delay_s=0), request)
    assert events[0] == ToolCallRequest("call_1_list_open_orders", "list_open_orders", "{}")
    assert [e for e in events if not isinstance(e, Finish)] == [
        e for e in demo if not isinstance(e, Finish)
    ]

    # The next step, with the tool result in the history, answers in the demo's words.
    from parley.context import WindowMessage

    result = {"orders": [{"order_id": "NW-1001", "status": "processing"}]}
    window = [
        WindowMessage(1, "user", "Where is my order?", "complete"),
        WindowMessage(
            2,
            "assistant",
            "",
            "complete",
            tool_calls=[
                {"id": "call_1_list_open_orders", "name": "list_open_orders", "arguments": {}}
            ],
        ),
        WindowMessage(
            3,
            "tool",
            json.dumps({"name": "list_open_orders", "result": result}),
            "complete",
            tool_call_id="call_1_list_open_orders",
        ),
    ]
    follow_up = parley_request(window)
    events = await collect(p, follow_up)
    demo = await collect(DemoModel(token_delay_s=0), follow_up)
    text = "".join(e.text for e in events if isinstance(e, TextDelta))
    assert text == "".join(e.text for e in demo if isinstance(e, TextDelta))
    assert "NW-1001" in text


async def test_scripted_fault_before_brain_reply(fake: FakeProvider, url: str) -> None:
    fake.brain = True
    fake.script(Reply(brain=True, drop_after=1))
    with pytest.raises(ProviderRetryable):
        await collect(provider("openai", url), parley_request())
    events = await collect(provider("openai", url), parley_request())
    assert isinstance(events[0], ToolCallRequest)


async def test_control_endpoints(fake: FakeProvider, url: str) -> None:
    import httpx

    async with httpx.AsyncClient(base_url=url) as client:
        queued = await client.post(
            "/_fake/script",
            json=[{"status": 429, "retry_after": "1"}, {"text": "Hi there"}],
        )
        assert queued.json() == {"queued": 2}
        p = provider("anthropic", url)
        with pytest.raises(ProviderRetryable):
            await collect(p, simple_request())
        events = await collect(p, simple_request())
        assert [e.text for e in events if isinstance(e, TextDelta)] == ["Hi ", "there"]
        seen = (await client.get("/_fake/requests")).json()
        assert [r["path"] for r in seen] == ["/v1/messages", "/v1/messages"]
        await client.post("/_fake/reset")
        assert (await client.get("/_fake/requests")).json() == []
        assert (await client.put("/_fake/brain", json={"enabled": True})).json() == {
            "enabled": True
        }


async def test_nothing_scripted_is_a_clear_fatal_error(fake: FakeProvider, url: str) -> None:
    with pytest.raises(ProviderFatal, match="fake_script_empty"):
        await collect(provider("openai", url), simple_request())


# --- configuration -------------------------------------------------------------------------


def test_build_provider_reads_the_sdk_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-x")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-y")
    assert isinstance(build_provider(Settings(model_provider="openai")), OpenAICompatProvider)
    assert isinstance(build_provider(Settings(model_provider="anthropic")), AnthropicProvider)
    assert isinstance(build_provider(Settings(model_provider="demo")), DemoModel)
    monkeypatch.delenv("OPENAI_API_KEY")
    with pytest.raises(ValueError, match="OPENAI_API_KEY"):
        build_provider(Settings(model_provider="openai"))
    with pytest.raises(ValueError, match="unknown model provider"):
        build_provider(Settings(model_provider="nope"))


def test_state_block_helper_is_what_brain_mode_reads() -> None:
    # The brain rebuilds separate system messages; the state block must stay its own message.
    block = state_block({"resolution": {}})
    system, _ = to_anthropic_messages([{"role": "system", "content": "x"}, block])
    assert system[1]["text"] == block["content"]
