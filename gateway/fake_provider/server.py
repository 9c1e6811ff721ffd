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
conversation can run through the real SDKs and produce what the demo model would. There,
`summarizer` (a function of the canonical request) answers the rolling summary's requests
instead, as a real model might: plain text, broken JSON, or valid JSON. A request that forces
a tool (Anthropic's structured output) is answered with a call to that tool, as Anthropic
does.

By hand:

    python -m parley.gateway.fake_provider --port 8200 --brain
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
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from parley.gateway.base import ModelRequest
from parley.gateway.demo import compose_reply, tokenize
from parley.gateway.fake_provider.embeddings import add_embeddings_route
from parley.gateway.fake_provider.wire import (
    Dialect,
    Fail,
    Frame,
    Reply,
    ToolCall,
    anthropic_sse,
    awkward_pieces,
    openai_sse,
    request_from_anthropic,
    request_from_openai,
    script_item,
)
from parley.memory import is_summary_request
from parley.tokens import count_messages, count_tools, default_counter

__all__ = [
    "Fail",
    "FakeProvider",
    "Frame",
    "Reply",
    "ToolCall",
    "anthropic_sse",
    "awkward_pieces",
    "openai_sse",
    "request_from_anthropic",
    "request_from_openai",
    "script_item",
]


# --- the server --------------------------------------------------------------------------


@dataclass(frozen=True)
class Recorded:
    path: str
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)
    # What the answer's usage report says (`Reply` token fields: input_tokens counts every
    # prompt token, cached_tokens the cache reads, cache_write_tokens the cache writes);
    # None for a request answered with an error. The provider's own log of what it bills.
    usage: dict[str, int] | None = None


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
        # In brain mode: the text that answers a summarizer's request (None: the demo's JSON).
        self.summarizer: Callable[[ModelRequest], str] | None = None
        # Prompt caching in brain mode: OpenAI's prompts seen (prefixes are cached), and
        # Anthropic's cached prefixes (up to a `cache_control` breakpoint) written so far.
        self._openai_prompts: list[list[str]] = []
        self._anthropic_prefixes: set[str] = set()
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
        self._openai_prompts.clear()
        self._anthropic_prefixes.clear()

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

        add_embeddings_route(app)

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
        index = len(self.requests) - 1
        item = self.queue.popleft() if self.queue else Reply(brain=True) if self.brain else None
        if item is None:
            return _error(dialect, Fail(status=400, error_type="fake_script_empty"))
        if isinstance(item, Fail):
            return _error(dialect, item)
        if not body.get("stream"):
            return _error(dialect, Fail(status=400, error_type="fake_streams_only"))
        refusal = anthropic_refusal(body) if dialect == "anthropic" else None
        if refusal is not None:
            return _error(dialect, Fail(status=400, message=refusal))
        if item.stall_s and not await _stall(request, item.stall_s):
            return Response(status_code=499)  # the client gave up; nobody reads this
        reply = self._think(dialect, body, item) if item.brain else item
        reported = _reported(reply) if reply.report_usage or dialect != "openai" else None
        self.requests[index] = replace(self.requests[index], usage=reported)
        if dialect == "openai":
            asked = bool((body.get("stream_options") or {}).get("include_usage"))
            include_usage = asked and reply.report_usage
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
        if self.summarizer is not None and is_summary_request(request.messages):
            text, calls = self.summarizer(request), []
        else:
            answer = compose_reply(request)
            text = answer.text
            calls = [
                ToolCall(id=c.id, name=c.name, arguments=c.arguments) for c in answer.tool_calls
            ]
        forced = body.get("tool_choice") or {}
        if forced.get("type") == "tool" and not calls:  # the answer is the forced tool's input
            calls, text = [ToolCall(name=forced["name"], arguments=text)], ""
        tokens = tokenize(text)
        billed = prompt_tokens(request, body)
        if dialect == "anthropic" and body.get("tools"):
            billed += anthropic_tool_prompt(body)
        cached, written = (
            (self._openai_cached(request), 0)
            if dialect == "openai"
            else self._anthropic_cached(request, body)
        )
        return item.model_copy(
            update={
                "text": tokens,
                "tool_calls": calls,
                "input_tokens": billed,
                "cached_tokens": cached,
                "cache_write_tokens": written,
                "output_tokens": len(tokens) + 10 * len(calls),
                "delay_s": item.delay_s or self.token_delay_s,
            }
        )

    def _openai_cached(self, request: ModelRequest) -> int:
        """OpenAI's automatic prefix caching: the tools and the longest run of leading
        messages this prompt shares with an earlier one, counted when it reaches 1,024
        tokens and then in steps of 128 (as the API reports `cached_tokens`)."""
        counter = default_counter()
        prompt = [json.dumps(m, sort_keys=True) for m in request.messages]
        shared = max((_leading(prompt, seen) for seen in self._openai_prompts), default=0)
        self._openai_prompts.append(prompt)
        if not shared:
            return 0
        tokens = count_tools(counter, request.tools) + count_messages(
            counter, request.messages[:shared]
        )
        return 0 if tokens < OPENAI_CACHE_MIN else tokens - (tokens - OPENAI_CACHE_MIN) % 128

    def _anthropic_cached(self, request: ModelRequest, body: dict[str, Any]) -> tuple[int, int]:
        """Anthropic's prompt caching: the prefix up to the last `cache_control` breakpoint
        among the tools and the system blocks (tools, then system: the API's order) is
        written to the cache on its first request and read on the next ones, once it reaches
        the model's minimum. (reads, writes) in tokens."""
        counter = default_counter()
        system = body.get("system") or []
        marked = [i for i, block in enumerate(system) if block.get("cache_control")]
        if not marked and not any(t.get("cache_control") for t in body.get("tools") or []):
            return 0, 0
        upto = system[: marked[-1] + 1] if marked else []
        tokens = (
            anthropic_tool_prompt(body)
            + count_tools(counter, request.tools)
            + sum(counter.count(block.get("text", "")) for block in upto)
        )
        if tokens < anthropic_cache_min(str(body.get("model", ""))):
            return 0, 0
        prefix = json.dumps([body.get("tools"), upto], sort_keys=True)
        if prefix in self._anthropic_prefixes:
            return tokens, 0
        self._anthropic_prefixes.add(prefix)
        return 0, tokens


# The smallest prefix each provider caches, in tokens (their documented minimums).
OPENAI_CACHE_MIN = 1024


def anthropic_tool_prompt(body: dict[str, Any]) -> int:
    """The tokens of the system prompt Anthropic adds to a request with tools (billed as
    input, first in the prompt, so inside any cached prefix): its documented counts for
    current models, 346 with `tool_choice` auto or none, 313 with a forced tool."""
    if not body.get("tools"):
        return 0
    forced = (body.get("tool_choice") or {}).get("type") in ("any", "tool")
    return 313 if forced else 346


def anthropic_cache_min(model: str) -> int:
    """Anthropic caches no prefix shorter than 1,024 tokens (2,048 for its Haiku models)."""
    return 2048 if "haiku" in model else 1024


def _leading(prompt: list[str], seen: list[str]) -> int:
    """How many leading messages two prompts share."""
    shared = 0
    for a, b in zip(prompt, seen, strict=False):
        if a != b:
            break
        shared += 1
    return shared


def _reported(reply: Reply) -> dict[str, int]:
    return {
        "input_tokens": reply.input_tokens,
        "cached_tokens": reply.cached_tokens,
        "cache_write_tokens": reply.cache_write_tokens,
        "output_tokens": reply.output_tokens,
    }


def prompt_tokens(request: ModelRequest, body: dict[str, Any]) -> int:
    """The prompt's tokens as a provider bills them: the messages, the tool schemas and a
    structured-output schema, by the counter the context builder budgets with (so a bench
    can set the usage beside its own counts)."""
    counter = default_counter()
    schema = body.get("response_format") or {}  # Anthropic's forced tool is among the tools
    return (
        count_messages(counter, request.messages)
        + count_tools(counter, request.tools)
        + (counter.count(json.dumps(schema, sort_keys=True)) if schema else 0)
    )


def plain_summary(request: ModelRequest) -> str:
    """A summarizer that answers in prose whatever it is asked (as many models and local
    servers do when asked for JSON): every summary request fails validation."""
    del request
    return "Here is a summary: the customer talked about their orders and a few other things."


# `--summarizer`: what a brain-mode server answers the rolling summary's requests with.
SUMMARIZERS: dict[str, Callable[[ModelRequest], str] | None] = {
    "demo": None,  # the demo model's own JSON
    "plain": plain_summary,
}


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


def anthropic_refusal(body: dict[str, Any]) -> str | None:
    """Why the Messages API would refuse this body with a 400, for the rules about extended
    thinking that a request can break (None: it would take it). The real API's checks, so an
    adapter that breaks one fails here as it would in production."""
    thinking = body.get("thinking") or {}
    if thinking.get("type") != "enabled":
        return None
    budget = thinking.get("budget_tokens", 0)
    if budget < 1024:
        return "thinking.budget_tokens: must be at least 1024"
    if body.get("max_tokens", 0) <= budget:
        return "max_tokens must be greater than thinking.budget_tokens"
    if (body.get("tool_choice") or {}).get("type") in ("any", "tool"):
        return "Thinking may not be enabled when tool_choice forces tool use."
    return None


def _error(dialect: Dialect, fail: Fail) -> JSONResponse:
    kind = fail.error_type or _error_type(dialect, fail.status)
    message = fail.message or f"fake provider: scripted HTTP {fail.status}"
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
    parser.add_argument(
        "--summarizer",
        choices=sorted(SUMMARIZERS),
        default="demo",
        help="brain mode: how the rolling summary's requests are answered",
    )
    args = parser.parse_args()
    fake = FakeProvider(brain=args.brain, token_delay_s=args.token_delay_ms / 1000)
    fake.summarizer = SUMMARIZERS[args.summarizer]
    uvicorn.run(fake.app, host=args.host, port=args.port, log_level="info")


if __name__ == "__main__":
    main()
