"""The provider interface and the canonical request/stream types.

A provider turns a canonical `ModelRequest` into a stream of `TextDelta`s closed by one
`Finish`. Retries are not a provider's business: the call-model activity's Temporal retry
policy owns them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class ModelRequest:
    model: str
    # Canonical messages: {"role": "system"|"user"|"assistant"|"tool", "content": str, ...}
    messages: list[dict[str, Any]]
    max_output_tokens: int = 1024


@dataclass(frozen=True)
class TextDelta:
    text: str


@dataclass(frozen=True)
class Finish:
    reason: str  # "stop" | "length" | "tool_calls"
    usage: dict[str, int] = field(default_factory=dict)


StreamEvent = TextDelta | Finish


class ModelProvider(Protocol):
    name: str

    def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]: ...
