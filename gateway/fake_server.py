"""A local fake model provider that speaks OpenAI Chat Completions and Anthropic Messages.

It lets the real SDK code paths run without a network or a key: replies are streamed as
Server-Sent Events byte-for-byte in each provider's shape, tool-call arguments split at
awkward places (mid-key, mid-escape, mid-unicode), and every request body is recorded so a
test can assert the translated wire format.

What it answers comes from a script (`FakeProvider.script(...)` or `POST /_fake/script`):
`Reply` items (text, tool calls, usage, and faults of a started stream: a stall before the
first byte, a delay between events, a drop mid-stream) and `Fail` items (an HTTP error such
as 429 with `retry-after`). In brain mode an empty script is answered by the demo model's
logic, run on the canonical request rebuilt from the wire body, so a whole Parley
conversation can run through the real SDKs and produce what the demo model would.

By hand:

    python -m gateway.fake_server --port 8200 --brain
    OPENAI_BASE_URL=http://127.0.0.1:8200/v1 OPENAI_API_KEY=fake PARLEY_MODEL_PROVIDER=openai
    ANTHROPIC_BASE_URL=http://127.0.0.1:8200 ANTHROPIC_API_KEY=fake \
        PARLEY_MODEL_PROVIDER=anthropic
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, Field, field_validator

from gateway.anthropic import RAW_ARGUMENTS_KEY
from gateway.base import ModelRequest
from gateway.demo import compose_reply, tokenize

Dialect = Literal["openai", "anthropic"]


# --- the script --------------------------------------------------------------------------


class ToolCall(BaseModel):
    name: str
    # Sent verbatim, so a test can script malformed JSON.
    arguments: str = "{}"
    # Generated per dialect when unset ("call_fake_0", "toolu_fake_0").
    id: str | None = None
    # How the arguments are fragmented on the wire; default `awkward_pieces(arguments)`.
    pieces: list[str] | None = None


class Reply(BaseModel):
    # Text deltas in order; a plain string is split like the demo model's tokens.
    text: list[str] = Field(default_factory=list)
    tool_calls: list[ToolCall] = Field(default_factory=list)
    # Take text and tool calls from the demo model's logic instead.
    brain: bool = False
    finish: Literal["stop", "length", "tool_calls"] | None = None  # default: from content
    input_tokens: int = 21  # all prompt tokens, the cached ones included
    output_tokens: int = 7
    cached_tokens: int = 0
    stall_s: float = 0.0  # before the response starts: not even the headers go out
    delay_s: float = 0.0  # before each event
    drop_after: int | None = None  # close the connection after this many content deltas

    @field_validator("text", mode="before")
    @classmethod
    def _split_text(cls, value: Any) -> Any:
        return tokenize(value) if isinstance(value, str) else value


class Fail(BaseModel):
    status: int
    retry_after: str | None = None
    error_type: str | None = None  # default: the provider's type for the status


def script_item(data: dict[str, Any]) -> Reply | Fail:
    """A JSON script item: one with a `status` is a `Fail`, anything else a `Reply`."""
    return Fail.model_validate(data) if "status" in data else Reply.model_validate(data)


def awkward_pieces(text: str) -> list[str]:
    """Cut JSON text where a careless reassembler breaks: inside the first key, right after
    every backslash (mid-escape), inside every `\\uXXXX`, around every non-ASCII character,
    and every seven characters besides."""
    cuts = {3, *range(7, len(text), 7)}
    for i, ch in enumerate(text):
        if ch == "\\":
            cuts.add(i + 1)
            if text[i + 1 : i + 2] == "u":
                cuts.add(i + 4)
        elif ord(ch) > 127:
            cuts.update((i, i + 1))
    bounds = [0, *sorted(c for c in cuts if 0 < c < len(text)), len(text)]
    return [text[a:b] for a, b in zip(bounds, bounds[1:], strict=False) if a < b]


# --- SSE encoding, exactly as each provider sends it -------------------------------------


class Frame(NamedTuple):
    data: bytes
    content: bool  # a text or tool-argument delta (what `drop_after` counts)


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _finish(reply: Reply) -> str:
    return reply.finish or ("tool_calls" if reply.tool_calls else "stop")


def openai_sse(reply: Reply, *, model: str = "fake-model", usage: bool = True) -> list[Frame]:
    base = {
        "id": "chatcmpl-fake",
        "object": "chat.completion.chunk",
        "created": 1_767_225_600,
        "model": model,
        "system_fingerprint": "fp_fake",
    }

    def chunk(delta: dict[str, Any], finish: str | None = None, content: bool = False) -> Frame:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        body = {**base, "choices": [choice], **({"usage": None} if usage else {})}
        return Frame(f"data: {_json(body)}\n\n".encode(), content)

    frames = [chunk({"role": "assistant", "content": "", "refusal": None})]
    frames += [chunk({"content": piece}, content=True) for piece in reply.text]
    for index, call in enumerate(reply.tool_calls):
        head = {
            "index": index,
            "id": call.id or f"call_fake_{index}",
            "type": "function",
            "function": {"name": call.name, "arguments": ""},
        }
        frames.append(chunk({"tool_calls": [head]}, content=True))
        for piece in call.pieces or awkward_pieces(call.arguments):
            fragment = {"index": index, "function": {"arguments": piece}}
            frames.append(chunk({"tool_calls": [fragment]}, content=True))
    frames.append(chunk({}, _finish(reply)))
    if usage:
        report = {
            "prompt_tokens": reply.input_tokens,
            "completion_tokens": reply.output_tokens,
            "total_tokens": reply.input_tokens + reply.output_tokens,
            "prompt_tokens_details": {"cached_tokens": reply.cached_tokens, "audio_tokens": 0},
            "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0},
        }
        body = {**base, "choices": [], "usage": report}
        frames.append(Frame(f"data: {_json(body)}\n\n".encode(), False))
    frames.append(Frame(b"data: [DONE]\n\n", False))
    return frames


_STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


def anthropic_sse(reply: Reply, *, model: str = "fake-model") -> list[Frame]:
    def event(name: str, body: dict[str, Any], content: bool = False) -> Frame:
        return Frame(f"event: {name}\ndata: {_json({'type': name, **body})}\n\n".encode(), content)

    message: dict[str, Any] = {
        "id": "msg_fake",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {
            "input_tokens": reply.input_tokens - reply.cached_tokens,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": reply.cached_tokens,
            "output_tokens": 1,
        },
    }
    frames = [event("message_start", {"message": message})]
    index = 0
    if reply.text:
        block = {"type": "text", "text": ""}
        frames.append(event("content_block_start", {"index": index, "content_block": block}))
        for piece in reply.text:
            delta = {"type": "text_delta", "text": piece}
            frames.append(event("content_block_delta", {"index": index, "delta": delta}, True))
        frames.append(event("content_block_stop", {"index": index}))
        index += 1
    for n, call in enumerate(reply.tool_calls):
        block = {"type": "tool_use", "id": call.id or f"toolu_fake_{n}", "name": call.name}
        start = {"index": index, "content_block": {**block, "input": {}}}
        frames.append(event("content_block_start", start, True))
        for piece in ["", *(call.pieces or awkward_pieces(call.arguments))]:
            delta = {"type": "input_json_delta", "partial_json": piece}
            frames.append(event("content_block_delta", {"index": index, "delta": delta}, True))
        frames.append(event("content_block_stop", {"index": index}))
        index += 1
    frames.insert(min(2, len(frames)), event("ping", {}))  # as sent: after the first block starts
    stop = {"stop_reason": _STOP_REASONS[_finish(reply)], "stop_sequence": None}
    usage = {"output_tokens": reply.output_tokens}
    frames.append(event("message_delta", {"delta": stop, "usage": usage}))
    frames.append(event("message_stop", {}))
    return frames


# --- the wire back to the canonical request (for brain mode) -----------------------------


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    parts = content or []
    return "".join(p.get("text", "") for p in parts if isinstance(p, dict))


def _parsed(arguments: str) -> Any:
    try:
        return json.loads(arguments)
    except json.JSONDecodeError:
        return arguments


def request_from_openai(body: dict[str, Any]) -> ModelRequest:
    messages: list[dict[str, Any]] = []
    for m in body["messages"]:
        role = "system" if m["role"] == "developer" else m["role"]
        message: dict[str, Any] = {"role": role, "content": _text(m.get("content"))}
        if m.get("tool_calls"):
            message["tool_calls"] = [
                {
                    "id": c["id"],
                    "name": c["function"]["name"],
                    "arguments": _parsed(c["function"]["arguments"]),
                }
                for c in m["tool_calls"]
            ]
        if role == "tool":
            message["tool_call_id"] = m["tool_call_id"]
        messages.append(message)
    tools = [
        {
            "name": t["function"]["name"],
            "description": t["function"].get("description", ""),
            "parameters": t["function"].get("parameters", {}),
        }
        for t in body.get("tools") or []
    ]
    limit = body.get("max_completion_tokens") or body.get("max_tokens") or 1024
    return ModelRequest(body["model"], messages, tools, limit)


def request_from_anthropic(body: dict[str, Any]) -> ModelRequest:
    system = body.get("system") or []
    blocks = [{"type": "text", "text": system}] if isinstance(system, str) else system
    messages: list[dict[str, Any]] = [{"role": "system", "content": b["text"]} for b in blocks]
    for m in body["messages"]:
        content = m["content"]
        parts: list[dict[str, Any]] = (
            [{"type": "text", "text": content}] if isinstance(content, str) else content
        )
        if m["role"] == "user":
            for part in parts:
                if part["type"] == "tool_result":
                    messages.append(
                        {
                            "role": "tool",
                            "content": _text(part.get("content")),
                            "tool_call_id": part["tool_use_id"],
                        }
                    )
                elif part["type"] == "text":
                    messages.append({"role": "user", "content": part["text"]})
            continue
        message: dict[str, Any] = {"role": "assistant", "content": _text(parts)}
        calls = [
            {"id": p["id"], "name": p["name"], "arguments": _arguments(p["input"])}
            for p in parts
            if p["type"] == "tool_use"
        ]
        if calls:
            message["tool_calls"] = calls
        messages.append(message)
    tools = [
        {
            "name": t["name"],
            "description": t.get("description", ""),
            "parameters": t.get("input_schema", {}),
        }
        for t in body.get("tools") or []
    ]
    return ModelRequest(body["model"], messages, tools, body["max_tokens"])


def _arguments(tool_input: dict[str, Any]) -> Any:
    if set(tool_input) == {RAW_ARGUMENTS_KEY}:
        return tool_input[RAW_ARGUMENTS_KEY]
    return tool_input


# --- the server --------------------------------------------------------------------------


@dataclass(frozen=True)
class Recorded:
    path: str
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)


class ConnectionDropped(Exception):
    """Raised inside a streaming body: uvicorn then closes the socket mid-response."""


class _HideDrops(logging.Filter):
    """Keep uvicorn from logging a scripted drop as an application crash."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not _is_drop(record.exc_info[1] if record.exc_info else None)


def _is_drop(exc: BaseException | None) -> bool:
    if isinstance(exc, BaseExceptionGroup):
        return any(_is_drop(e) for e in exc.exceptions)
    return isinstance(exc, ConnectionDropped)


def _error_type(dialect: Dialect, status: int) -> str:
    """The error type each provider puts in its error body for a status."""
    if status == 429:
        return "rate_limit_exceeded" if dialect == "openai" else "rate_limit_error"
    if status >= 500:
        return "overloaded_error" if status == 529 else "api_error"
    if dialect == "openai":
        return "invalid_request_error"
    named = {401: "authentication_error", 403: "permission_error", 404: "not_found_error"}
    return named.get(status, "invalid_request_error")


class FakeProvider:
    """The fake's state and its ASGI app (`.app`): a script queue and the requests seen."""

    def __init__(self, *, brain: bool = False, token_delay_s: float = 0.0) -> None:
        self.brain = brain
        self.token_delay_s = token_delay_s  # between brain-mode events
        self.queue: deque[Reply | Fail] = deque()
        self.requests: list[Recorded] = []
        self.flag_terms = set()
        self.app = self._build_app()
        uvicorn_log = logging.getLogger("uvicorn.error")
        if not any(isinstance(f, _HideDrops) for f in uvicorn_log.filters):
            uvicorn_log.addFilter(_HideDrops())

    # Text containing any of these is flagged by the fake moderation endpoint.
    flag_terms: set[str]

    def script(self, *items: Reply | Fail) -> None:
        """Queue replies; each request takes the next one."""
        self.queue.extend(items)

    def reset(self) -> None:
        self.queue.clear()
        self.requests.clear()

    def _build_app(self) -> FastAPI:
        app = FastAPI(title="Parley fake model provider")

        @app.post("/v1/chat/completions")
        async def chat_completions(request: Request) -> Response:
            """OpenAI Chat Completions, streaming."""
            return await self._answer(request, "openai")

        @app.post("/v1/messages")
        async def messages(request: Request) -> Response:
            """Anthropic Messages, streaming."""
            return await self._answer(request, "anthropic")

        @app.post("/v1/moderations")
        async def moderations(request: Request) -> dict[str, Any]:
            """OpenAI moderation: flags text containing one of `flag_terms` as harassment."""
            body = await request.json()
            inputs = body["input"] if isinstance(body["input"], list) else [body["input"]]
            results = []
            for text in inputs:
                hit = any(term in str(text).lower() for term in self.flag_terms)
                results.append(
                    {
                        "flagged": hit,
                        "categories": {"harassment": hit, "violence": False},
                        "category_scores": {"harassment": 0.99 if hit else 0.0, "violence": 0.0},
                    }
                )
            return {"id": "modr-fake", "model": "omni-moderation-latest", "results": results}

        @app.post("/_fake/script")
        async def script(request: Request) -> dict[str, int]:
            """Queue scripted replies: a JSON list of Reply/Fail objects."""
            self.script(*(script_item(item) for item in await request.json()))
            return {"queued": len(self.queue)}

        @app.get("/_fake/requests")
        async def requests() -> list[dict[str, Any]]:
            """Every request body received, oldest first."""
            return [{"path": r.path, "body": r.body, "headers": r.headers} for r in self.requests]

        @app.post("/_fake/reset")
        async def reset() -> dict[str, bool]:
            """Forget the script and the recorded requests."""
            self.reset()
            return {"ok": True}

        @app.put("/_fake/brain")
        async def brain(request: Request) -> dict[str, bool]:
            """Turn brain mode on or off: {"enabled": true}."""
            self.brain = bool((await request.json())["enabled"])
            return {"enabled": self.brain}

        return app

    async def _answer(self, request: Request, dialect: Dialect) -> Response:
        body = await request.json()
        self.requests.append(Recorded(request.url.path, body, _redacted(request.headers)))
        item = self.queue.popleft() if self.queue else Reply(brain=True) if self.brain else None
        if item is None:
            return _error(dialect, Fail(status=400, error_type="fake_script_empty"))
        if isinstance(item, Fail):
            return _error(dialect, item)
        if not body.get("stream"):
            return _error(dialect, Fail(status=400, error_type="fake_streams_only"))
        if item.stall_s and not await _stall(request, item.stall_s):
            return Response(status_code=499)  # the client gave up; nobody reads this
        reply = self._think(dialect, body, item) if item.brain else item
        if dialect == "openai":
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            frames = openai_sse(reply, model=body["model"], usage=include_usage)
        else:
            frames = anthropic_sse(reply, model=body["model"])
        headers = {"x-request-id" if dialect == "openai" else "request-id": "req_fake"}
        return StreamingResponse(
            _send(frames, reply.delay_s, reply.drop_after),
            media_type="text/event-stream",
            headers=headers,
        )

    def _think(self, dialect: Dialect, body: dict[str, Any], item: Reply) -> Reply:
        """The demo model's answer to the canonical request behind this wire body."""
        request = request_from_openai(body) if dialect == "openai" else request_from_anthropic(body)
        answer = compose_reply(request)
        tokens = tokenize(answer.text)
        return item.model_copy(
            update={
                "text": tokens,
                "tool_calls": [
                    ToolCall(id=c.id, name=c.name, arguments=c.arguments) for c in answer.tool_calls
                ],
                "input_tokens": sum(len(tokenize(str(m["content"]))) for m in request.messages),
                "output_tokens": len(tokens) + 10 * len(answer.tool_calls),
                "delay_s": item.delay_s or self.token_delay_s,
            }
        )


async def _send(
    frames: list[Frame], delay_s: float, drop_after: int | None
) -> AsyncIterator[bytes]:
    sent = 0
    for frame in frames:
        if drop_after is not None and frame.content and sent >= drop_after:
            raise ConnectionDropped
        if delay_s:
            await asyncio.sleep(delay_s)
        yield frame.data
        sent += frame.content


async def _stall(request: Request, seconds: float) -> bool:
    """Wait without sending a byte; False if the client hung up meanwhile."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while (left := deadline - loop.time()) > 0:
        if await request.is_disconnected():
            return False
        await asyncio.sleep(min(0.05, left))
    return True


def _error(dialect: Dialect, fail: Fail) -> JSONResponse:
    kind = fail.error_type or _error_type(dialect, fail.status)
    message = f"fake provider: scripted HTTP {fail.status}"
    headers = {"retry-after": fail.retry_after} if fail.retry_after is not None else {}
    if dialect == "openai":
        headers["x-request-id"] = "req_fake"
        body: dict[str, Any] = {
            "error": {"message": message, "type": kind, "param": None, "code": kind}
        }
    else:
        headers["request-id"] = "req_fake"
        body = {"type": "error", "error": {"type": kind, "message": message}}
    return JSONResponse(body, status_code=fail.status, headers=headers)


def _redacted(headers: Any) -> dict[str, str]:
    """Request headers with keys cut to their last four characters (none of a short one)."""
    out = {k.lower(): v for k, v in headers.items()}
    for name in ("authorization", "x-api-key"):
        if name in out:
            out[name] = "***" + (out[name][-4:] if len(out[name]) > 16 else "")
    return out


def main() -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description="Parley fake model provider")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8200)
    parser.add_argument("--brain", action="store_true", help="answer with the demo model")
    parser.add_argument("--token-delay-ms", type=float, default=15.0)
    args = parser.parse_args()
    fake = FakeProvider(brain=args.brain, token_delay_s=args.token_delay_ms / 1000)
    uvicorn.run(fake.app, host=args.host, port=args.port, log_level="info")


if __name__ == "__main__":
    main()
