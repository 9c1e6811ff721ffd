"""OpenAI-compatible Chat Completions (OpenAI itself, vLLM, Ollama, LiteLLM, ...) via the
official `openai` SDK, streaming, with tools.

History is stored in the canonical format and translated here on every call, so switching
providers never rewrites a conversation. Text deltas pass straight through; tool calls
arrive as fragments keyed by `index` (the `id` and name on the first one only) and are
emitted whole once the choice's `finish_reason` arrives. Usage comes in a final chunk with
no choices because we ask for `stream_options.include_usage`.

The SDK sends the request (auth, headers, the status errors); the stream's body is read as
plain JSON chunks (gateway/sse.py), not as the SDK's chunk models, whose construction per
token was most of a busy worker's CPU. An error object inside a 200 stream is the SDK's
`APIError` case, classified the same way.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any, Literal, cast

import httpx2
import openai

import parley.gateway.errors as errors
import parley.gateway.sse as sse
from parley.gateway.base import (
    Finish,
    ModelRequest,
    OutputSchema,
    StreamEvent,
    TextDelta,
    ToolCallRequest,
)

_FINISH = {"stop": "stop", "length": "length", "tool_calls": "tool_calls"}


def to_openai_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Canonical messages → Chat Completions messages, one for one and in order (several
    system messages stay separate, which keeps the stable instructions a cacheable prefix)."""
    wire: list[dict[str, Any]] = []
    for m in messages:
        role, content = m["role"], m.get("content") or ""
        if role == "assistant" and m.get("tool_calls"):
            wire.append(
                {
                    "role": "assistant",
                    # Chat Completions wants null, not "", beside tool calls.
                    "content": content or None,
                    "tool_calls": [
                        {
                            "id": call["id"],
                            "type": "function",
                            "function": {
                                "name": call["name"],
                                "arguments": arguments_text(call.get("arguments")),
                            },
                        }
                        for call in m["tool_calls"]
                    ],
                }
            )
        elif role == "tool":
            wire.append({"role": "tool", "tool_call_id": m["tool_call_id"], "content": content})
        else:
            wire.append({"role": role, "content": content})
    return wire


def arguments_text(arguments: Any) -> str:
    """Stored arguments are a parsed object, or the model's raw text when it did not parse:
    that text goes back verbatim so the model sees what it wrote."""
    if isinstance(arguments, str):
        return arguments
    return json.dumps({} if arguments is None else arguments, ensure_ascii=False)


def to_openai_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {
            "type": "function",
            "function": {
                "name": tool["name"],
                "description": tool.get("description", ""),
                "parameters": tool.get("parameters") or {"type": "object", "properties": {}},
            },
        }
        for tool in tools
    ]


def to_openai_response_format(output: OutputSchema) -> dict[str, Any]:
    """Structured Outputs: the answer's text is one JSON object of the schema (`strict`: the
    schema must list every property as required and forbid others, as ours do)."""
    schema: dict[str, Any] = {"name": output.name, "schema": output.schema, "strict": True}
    if output.description:
        schema["description"] = output.description
    return {"type": "json_schema", "json_schema": schema}


@dataclass
class _PendingCall:
    id: str = ""
    name: str = ""
    parts: list[str] = field(default_factory=list)


class OpenAICompatProvider:
    """A Chat Completions endpoint as a `ModelProvider`.

    `base_url` includes the version path (`https://api.openai.com/v1`,
    `http://127.0.0.1:11434/v1`); `None` lets the SDK read `OPENAI_BASE_URL`/`OPENAI_API_KEY`.
    `max_tokens_field` is `max_completion_tokens` (OpenAI's current name, required by its
    reasoning models) or `max_tokens` for older compatible servers.
    """

    name = "openai"
    reads_ahead = True  # the answer comes over a socket (gateway.base.reads_ahead)

    def __init__(
        self,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        timeouts: errors.Timeouts | None = None,
        max_tokens_field: Literal["max_completion_tokens", "max_tokens"] = (
            "max_completion_tokens"
        ),
        http_client: Any | None = None,
    ) -> None:
        self._timeouts = timeouts or errors.Timeouts()
        t = self._timeouts
        self._max_tokens_field = max_tokens_field
        self._client = openai.AsyncOpenAI(
            base_url=base_url,
            api_key=api_key,
            max_retries=0,  # Temporal's retry policy owns retries
            timeout=openai.Timeout(
                t.total_s, connect=t.connect_s, read=t.first_token_s, pool=t.connect_s
            ),
            http_client=http_client,
        )

    async def aclose(self) -> None:
        await self._client.close()

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
        params: dict[str, Any] = {
            "model": request.model,
            "messages": to_openai_messages(request.messages),
            "stream": True,
            "stream_options": {"include_usage": True},
            self._max_tokens_field: request.max_output_tokens,
        }
        if request.tools:
            params["tools"] = to_openai_tools(request.tools)
        if request.cache_key:
            # Routes requests sharing a prefix to the same cache (OpenAI's prompt caching).
            params["prompt_cache_key"] = request.cache_key
        if request.reasoning_effort:
            params["reasoning_effort"] = request.reasoning_effort
        if request.output_schema is not None:
            params["response_format"] = to_openai_response_format(request.output_schema)

        async def open_stream() -> _Chunks:
            # The raw response keeps the body unread: its chunks are taken as JSON below.
            create = cast(Any, self._client.chat.completions.with_raw_response.create)
            raw = await create(**_bare(params), extra_body=params)
            return _Chunks(self.name, raw.http_response)

        calls: dict[int, _PendingCall] = {}
        finish: str | None = None
        called = False
        usage: dict[str, int] = {}
        chunks = errors.guarded_stream(self.name, open_stream, self._timeouts, self._classify)
        async with aclosing(chunks):
            async for chunk in chunks:
                if chunk.get("usage"):
                    usage = _usage(chunk["usage"])
                for choice in chunk.get("choices") or ():
                    if choice.get("index", 0) != 0:  # we never ask for n > 1
                        continue
                    delta = choice.get("delta") or {}
                    text = delta.get("content") or delta.get("refusal")
                    if text:
                        yield TextDelta(text)
                    for fragment in delta.get("tool_calls") or ():
                        _add_fragment(calls, fragment)
                    if choice.get("finish_reason") is not None:
                        finish = _FINISH.get(choice["finish_reason"], "stop")
                        for call in _complete(calls):
                            called = True
                            yield call
        if finish is None:
            raise errors.incomplete_stream(self.name)
        for call in _complete(calls):  # fragments after the finish chunk (lenient servers)
            called = True
            yield call
        # Some compatible servers say "stop" after tool calls; the calls are what counts.
        yield Finish("tool_calls" if called and finish == "stop" else finish, usage)

    def _classify(self, exc: Exception, started: bool) -> errors.ProviderError | None:
        if isinstance(exc, openai.APIStatusError):
            return errors.status_error(
                self.name,
                exc.status_code,
                headers=exc.response.headers,
                error_type=errors.error_type(exc.body),
            )
        if isinstance(exc, openai.APITimeoutError):
            return errors.timeout_error(self.name, exc, started=started)
        if isinstance(exc, openai.APIConnectionError):
            cause = exc.__cause__ if isinstance(exc.__cause__, Exception) else exc
            return errors.connection_error(self.name, cause, started=started)
        if isinstance(exc, openai.APIError):  # an error object inside a 200 stream
            return errors.stream_error(self.name, errors.error_type(exc.body))
        return errors.transport_error(self.name, exc, started=started)


def _add_fragment(calls: dict[int, _PendingCall], fragment: dict[str, Any]) -> None:
    call = calls.setdefault(fragment.get("index", 0), _PendingCall())
    # The id and name come on the first fragment; some compatible servers repeat them.
    call.id = call.id or fragment.get("id") or ""
    function = fragment.get("function")
    if function is not None:
        call.name = call.name or function.get("name") or ""
        call.parts.append(function.get("arguments") or "")


def _complete(calls: dict[int, _PendingCall]) -> list[ToolCallRequest]:
    """Every buffered call, whole, in index order; the buffer is emptied."""
    done = [
        ToolCallRequest(call.id or f"call_{index}", call.name, "".join(call.parts))
        for index, call in sorted(calls.items())
    ]
    calls.clear()
    return done


def _bare(params: dict[str, Any]) -> dict[str, Any]:
    """The arguments `create` requires, with an empty message list: the request itself goes as
    the body's extra fields (`extra_body`, sent as given, the last word on every key). The SDK
    walks what `create` is given through a transform driven by its types, and for a long
    conversation with tools that costs more CPU than the rest of the call: 13.5 ms for 31
    messages and 10 tool schemas, measured. Parley's wire dicts are final JSON already.
    `stream` stays an argument: it is what keeps the response's body unread."""
    return {"model": params["model"], "messages": [], "stream": params["stream"]}


def _usage(usage: dict[str, Any]) -> dict[str, int]:
    details = usage.get("prompt_tokens_details") or {}
    return {
        "input_tokens": usage.get("prompt_tokens") or 0,
        "output_tokens": usage.get("completion_tokens") or 0,
        "cached_tokens": details.get("cached_tokens") or 0,
    }


class _Chunks:
    """The chunks of a streaming response body as JSON objects (an `errors.EventStream`):
    the stream ends at `[DONE]` (the rest of the body is read, so the connection can be
    reused), and an error object in the stream raises as the SDK's stream would."""

    def __init__(self, provider: str, response: httpx2.Response) -> None:
        self._provider = provider
        self._response = response

    async def __aiter__(self) -> AsyncIterator[dict[str, Any]]:
        done = False
        async for data in sse.event_data(self._response.aiter_bytes()):
            if done:
                continue
            if data.startswith(b"[DONE]"):
                done = True
                continue
            chunk = json.loads(data)
            if isinstance(chunk, dict) and chunk.get("error"):
                raise errors.stream_error(self._provider, errors.error_type(chunk["error"]))
            yield chunk

    async def close(self) -> None:
        await self._response.aclose()
