"""The provider interface and the canonical request/stream types.

A provider turns a canonical `ModelRequest` into a stream of `TextDelta`s and complete
`ToolCallRequest`s, closed by one `Finish`. Retries are not a provider's business: the
call-model activity's Temporal retry policy owns them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class OutputSchema:
    """Ask for one JSON object of this schema, in the provider's structured-output mode: a
    `response_format` of type `json_schema` for Chat Completions, one tool with this input
    schema that the model is made to call for Anthropic (its arguments are the answer). A
    provider without such a mode gets the instructions alone; the caller validates anyway."""

    # a-z, A-Z, 0-9, `_` and `-`, at most 64 characters (both providers' rule for names)
    name: str
    schema: dict[str, Any]
    description: str = ""


@dataclass(frozen=True)
class ModelRequest:
    model: str
    # Canonical messages: {"role": "system"|"user"|"assistant"|"tool", "content": str}, plus
    # "tool_calls": [{"id", "name", "arguments"}] on assistant messages and "tool_call_id"
    # on tool messages.
    messages: list[dict[str, Any]]
    # Provider-neutral tool definitions: {"name", "description", "parameters" (JSON schema)}.
    tools: list[dict[str, Any]] = field(default_factory=list)
    max_output_tokens: int = 1024
    # A stable key for the prompt's unchanging prefix, where the provider takes one.
    cache_key: str | None = None
    # "low" | "medium" | "high" for providers with a reasoning-effort setting.
    reasoning_effort: str | None = None
    # Structured output: the answer is one JSON object of this schema (as text, or as the
    # arguments of the one tool call the provider's mode makes).
    output_schema: OutputSchema | None = None


@dataclass(frozen=True)
class TextDelta:
    text: str


@dataclass(frozen=True)
class ToolCallRequest:
    """A complete tool call: providers stream fragments, the gateway joins them first."""

    id: str
    name: str
    arguments: str  # the JSON text exactly as the model produced it; validated later


@dataclass(frozen=True)
class Finish:
    reason: str  # "stop" | "length" | "tool_calls"
    usage: dict[str, int] = field(default_factory=dict)


StreamEvent = TextDelta | ToolCallRequest | Finish


class ModelProvider(Protocol):
    name: str

    def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]: ...


def reads_ahead(provider: object) -> bool:
    """Whether a provider's answer keeps arriving while nobody reads it: it comes over the
    network, and the socket's buffer holds what is not read yet (`reads_ahead = True` on the
    adapter), so a reader may take it in batches (activities/frames.py). A model made in this
    process makes its next token only when asked: reading it later only slows it down."""
    return getattr(provider, "reads_ahead", False) is True
