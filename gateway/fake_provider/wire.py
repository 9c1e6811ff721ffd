"""The wire formats the fake provider speaks, as pure functions.

Scripts of what to answer (`Reply`, `Fail`), the SSE encoders that write a reply exactly as
OpenAI and Anthropic stream it, and the reverse translation from each provider's request body
back to Parley's canonical request (so brain mode can answer like the demo model).
"""

from __future__ import annotations

import json
from typing import Any, Literal, NamedTuple

from pydantic import BaseModel, Field, field_validator

from parley.gateway.anthropic import RAW_ARGUMENTS_KEY
from parley.gateway.base import ModelRequest
from parley.gateway.demo import tokenize

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
    cached_tokens: int = 0  # read from the cache (OpenAI's cached_tokens, Anthropic's reads)
    cache_write_tokens: int = 0  # written to it (Anthropic's cache_creation_input_tokens)
    stall_s: float = 0.0  # before the response starts: not even the headers go out
    delay_s: float = 0.0  # before each event
    drop_after: int | None = None  # close the connection after this many content deltas
    # False: no usage in the stream even when asked for (OpenAI-compatible servers that
    # never report it); the request log records none either.
    report_usage: bool = True

    @field_validator("text", mode="before")
    @classmethod
    def _split_text(cls, value: Any) -> Any:
        return tokenize(value) if isinstance(value, str) else value


class Fail(BaseModel):
    status: int
    retry_after: str | None = None
    error_type: str | None = None  # default: the provider's type for the status
    message: str | None = None  # default: says it was scripted


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
            "input_tokens": reply.input_tokens - reply.cached_tokens - reply.cache_write_tokens,
            "cache_creation_input_tokens": reply.cache_write_tokens,
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
