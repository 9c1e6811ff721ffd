"""Anthropic Messages via the official `anthropic` SDK, streaming, with tools.

The canonical history is translated on every call: system messages become the top-level
`system` blocks (the first, stable one marked `cache_control: ephemeral`, the prompt-caching
breakpoint that covers tools and instructions), assistant tool calls become `tool_use`
blocks, tool results become `tool_result` blocks in a user message, and consecutive
same-role messages are merged because the API requires user/assistant alternation.

The stream is read as raw events (`messages.create(stream=True)`), not through the SDK's
accumulating helper, so text goes out the moment it arrives and a tool call is emitted
whole at its `content_block_stop`.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any, cast

import anthropic
from anthropic.types import MessageDeltaUsage, RawMessageStreamEvent, Usage

from parley.gateway.base import (
    Finish,
    ModelRequest,
    OutputSchema,
    StreamEvent,
    TextDelta,
    ToolCallRequest,
)
from parley.gateway.errors import (
    ProviderError,
    Timeouts,
    connection_error,
    error_type,
    guarded_stream,
    incomplete_stream,
    status_error,
    stream_error,
    timeout_error,
    transport_error,
)

_FINISH = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "tool_use": "tool_calls",
}
CACHE_HINT = {"type": "ephemeral"}
# `tool_use.input` must be an object; arguments the model wrote as broken JSON (stored as the
# raw text) travel under this one key so the model can still see what it sent.
RAW_ARGUMENTS_KEY = "_raw_arguments"


def to_anthropic_messages(
    messages: list[dict[str, Any]],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Canonical messages → (`system` blocks, alternating `messages`)."""
    system: list[dict[str, Any]] = []
    turns: list[dict[str, Any]] = []
    for m in messages:
        role, content = m["role"], m.get("content") or ""
        blocks: list[dict[str, Any]] = []
        if role == "system":
            if content:  # the API refuses empty text blocks
                system.append({"type": "text", "text": content})
            continue
        if role == "tool":
            role = "user"
            blocks.append(
                {"type": "tool_result", "tool_use_id": m["tool_call_id"], "content": content}
            )
        else:
            if content:
                blocks.append({"type": "text", "text": content})
            for call in m.get("tool_calls") or []:
                blocks.append(
                    {
                        "type": "tool_use",
                        "id": call["id"],
                        "name": call["name"],
                        "input": _tool_input(call.get("arguments")),
                    }
                )
        if not blocks:
            continue
        if turns and turns[-1]["role"] == role:
            turns[-1]["content"].extend(blocks)
        else:
            turns.append({"role": role, "content": blocks})
    for turn in turns:
        # Tool results must lead a user message, before any text.
        turn["content"].sort(key=lambda block: block["type"] != "tool_result")
    if system:
        system[0]["cache_control"] = dict(CACHE_HINT)
    return system, turns


def _tool_input(arguments: Any) -> dict[str, Any]:
    if isinstance(arguments, dict):
        return arguments
    if arguments is None:
        return {}
    raw = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    return {RAW_ARGUMENTS_KEY: raw}


def to_anthropic_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {
            "name": tool["name"],
            "description": tool.get("description", ""),
            "input_schema": tool.get("parameters") or {"type": "object", "properties": {}},
        }
        for tool in tools
    ]


def to_anthropic_output_tool(output: OutputSchema) -> dict[str, Any]:
    return {
        "name": output.name,
        "description": output.description or f"Answer with the {output.name} object.",
        "input_schema": output.schema,
    }


@dataclass
class _PendingCall:
    id: str
    name: str
    # The input from `content_block_start`: used only when no `input_json_delta` follows.
    start_input: Any
    parts: list[str] = field(default_factory=list)


class AnthropicProvider:
    """The Messages API as a `ModelProvider`.

    `base_url` is the host without `/v1` (the SDK adds `/v1/messages`); `None` lets the SDK
    read `ANTHROPIC_BASE_URL`/`ANTHROPIC_API_KEY`.
    Usage is reported like OpenAI's: `input_tokens` counts every prompt token (uncached,
    cache reads and cache writes), `cached_tokens` the cache reads among them, and
    `cache_write_tokens` the cache writes (billed above the input price: parley/costs.py).
    """

    name = "anthropic"
    reads_ahead = True  # the answer comes over a socket (gateway.base.reads_ahead)

    def __init__(
        self,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        timeouts: Timeouts | None = None,
        http_client: Any | None = None,
    ) -> None:
        self._timeouts = timeouts or Timeouts()
        t = self._timeouts
        self._client = anthropic.AsyncAnthropic(
            base_url=base_url,
            api_key=api_key,
            max_retries=0,  # Temporal's retry policy owns retries
            timeout=anthropic.Timeout(
                t.total_s, connect=t.connect_s, read=t.first_token_s, pool=t.connect_s
            ),
            http_client=http_client,
        )

    async def aclose(self) -> None:
        await self._client.close()

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
        params = _create_params(request)

        async def open_stream() -> anthropic.AsyncStream[RawMessageStreamEvent]:
            # The wire dicts follow the SDK's TypedDicts; the cast keeps translation plain JSON.
            create = cast(Any, self._client.messages.create)
            return cast(anthropic.AsyncStream[RawMessageStreamEvent], await create(**params))

        calls: dict[int, _PendingCall] = {}
        usage = _Usage()
        finish = "stop"
        complete = False
        events = guarded_stream(self.name, open_stream, self._timeouts, self._classify)
        try:
            async with aclosing(events):
                async for event in events:
                    if event.type == "message_start":
                        usage.update(event.message.usage)
                    elif event.type == "content_block_start":
                        block = event.content_block
                        if block.type == "tool_use":
                            calls[event.index] = _PendingCall(block.id, block.name, block.input)
                        elif block.type == "text" and block.text:
                            yield TextDelta(block.text)
                    elif event.type == "content_block_delta":
                        delta = event.delta
                        if delta.type == "text_delta" and delta.text:
                            yield TextDelta(delta.text)
                        elif delta.type == "input_json_delta" and event.index in calls:
                            calls[event.index].parts.append(delta.partial_json)
                    elif event.type == "content_block_stop":
                        call = calls.pop(event.index, None)
                        if call is not None:
                            yield ToolCallRequest(call.id, call.name, _arguments(call))
                    elif event.type == "message_delta":
                        usage.update(event.usage)
                        if event.delta.stop_reason is not None:
                            finish = _FINISH.get(event.delta.stop_reason, "stop")
                    elif event.type == "message_stop":
                        complete = True
            if not complete:
                raise incomplete_stream(self.name)
        except ProviderError as exc:
            # Billed by the provider all the same: its input counts came at `message_start`.
            exc.usage = usage.as_dict() if usage.reported else None
            raise
        for call in calls.values():  # a block left open by a lenient server
            yield ToolCallRequest(call.id, call.name, _arguments(call))
        yield Finish(finish, usage.as_dict())

    def _classify(self, exc: Exception, started: bool) -> ProviderError | None:
        if isinstance(exc, anthropic.APIStatusError):
            kind = error_type(exc.body)
            if exc.status_code < 400:  # an `error` event inside a 200 stream
                return stream_error(self.name, kind)
            return status_error(
                self.name, exc.status_code, headers=exc.response.headers, error_type=kind
            )
        if isinstance(exc, anthropic.APITimeoutError):
            return timeout_error(self.name, exc, started=started)
        if isinstance(exc, anthropic.APIConnectionError):
            cause = exc.__cause__ if isinstance(exc.__cause__, Exception) else exc
            return connection_error(self.name, cause, started=started)
        # The SDK's stream lets transport errors through unwrapped.
        return transport_error(self.name, exc, started=started)


def _arguments(call: _PendingCall) -> str:
    if call.parts:
        return "".join(call.parts)
    return json.dumps(call.start_input or {}, ensure_ascii=False)


@dataclass
class _Usage:
    """Running usage: `message_start` has the input counts, `message_delta` the cumulative
    output count (and, on newer API versions, input counts again, possibly null)."""

    uncached: int = 0
    cache_read: int = 0
    cache_written: int = 0
    output: int = 0

    @property
    def reported(self) -> bool:
        return bool(self.uncached or self.cache_read or self.cache_written or self.output)

    def update(self, report: Usage | MessageDeltaUsage) -> None:
        self.uncached = _latest(report.input_tokens, self.uncached)
        self.cache_read = _latest(report.cache_read_input_tokens, self.cache_read)
        self.cache_written = _latest(report.cache_creation_input_tokens, self.cache_written)
        self.output = _latest(report.output_tokens, self.output)

    def as_dict(self) -> dict[str, int]:
        usage = {
            "input_tokens": self.uncached + self.cache_read + self.cache_written,
            "output_tokens": self.output,
            "cached_tokens": self.cache_read,
        }
        if self.cache_written:  # as OpenAI's report, unless there were writes
            usage["cache_write_tokens"] = self.cache_written
        return usage


def _latest(value: int | None, previous: int) -> int:
    return previous if value is None else value


def _create_params(request: ModelRequest) -> dict[str, Any]:
    """The Messages API request for `request`, streamed."""
    system, messages = to_anthropic_messages(request.messages)
    params: dict[str, Any] = {
        "model": request.model,
        "max_tokens": request.max_output_tokens,
        "messages": messages,
        "stream": True,
    }
    if system:
        params["system"] = system
    if request.tools:
        params["tools"] = to_anthropic_tools(request.tools)
    if request.output_schema is not None:
        # Structured output is a tool the model must call: its input is the answer.
        output = request.output_schema
        params["tools"] = [*params.get("tools", []), to_anthropic_output_tool(output)]
        params["tool_choice"] = {"type": "tool", "name": output.name}
    if request.reasoning_effort and "tool_choice" not in params:
        # Extended thinking: a token budget that grows with the requested effort. The API
        # refuses thinking beside a forced tool (the structured output's), so a request with
        # an output schema is answered without it.
        budget = {"low": 1024, "medium": 4096, "high": 16384}[request.reasoning_effort]
        params["thinking"] = {"type": "enabled", "budget_tokens": budget}
        params["max_tokens"] = max(request.max_output_tokens, budget + 1024)
    return params
