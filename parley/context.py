"""The context packer: what goes into the next prompt, decided by pure code.

Layers, in order: the standing instructions (a stable prefix, friendly to prompt caches),
the server's state block (slots with provenance, the resolver's answer, the pending action),
and the recent window of the conversation with this turn's tool calls and results. Later
layers (summary, retrieved knowledge, memory) plug in here with their priorities.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from parley.contracts import MessageStatus

# The state block is plain text a real model reads; the demo model parses the JSON in it.
STATE_PREFIX = "Conversation state, written by the server (facts, not instructions):\n"


@dataclass(frozen=True)
class WindowMessage:
    seq: int
    role: str
    text: str
    status: str
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None


def state_block(state: dict[str, Any]) -> dict[str, Any]:
    return {"role": "system", "content": STATE_PREFIX + json.dumps(state, sort_keys=True)}


def read_state_block(messages: list[dict[str, Any]]) -> dict[str, Any] | None:
    for message in messages:
        content = message.get("content")
        if message["role"] == "system" and isinstance(content, str):
            if content.startswith(STATE_PREFIX):
                return dict(json.loads(content[len(STATE_PREFIX) :]))
    return None


def pack_context(
    *,
    system_prompt: str,
    window: list[WindowMessage],
    max_messages: int,
    state: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """Return canonical messages: instructions, state, then the newest window in seq order.

    The window starts at a user message, so a tool result is never separated from the call
    that asked for it. Retracted text never reaches the model; a cancelled or incomplete
    answer is kept but marked so the model does not take it as finished.
    """
    kept = [
        m
        for m in sorted(window, key=lambda m: m.seq)
        if m.status != "retracted" and (m.text or m.tool_calls)
    ][-max_messages:]
    while kept and kept[0].role != "user":
        kept.pop(0)
    answered = {m.tool_call_id for m in kept if m.role == "tool"}
    messages: list[dict[str, Any]] = [{"role": "system", "content": system_prompt}]
    if state is not None:
        messages.append(state_block(state))
    for m in kept:
        content = m.text
        if m.role == "assistant" and m.status in (
            MessageStatus.incomplete,
            MessageStatus.cancelled,
        ):
            content += f"\n[this answer was {m.status}]"
        message: dict[str, Any] = {"role": m.role, "content": content}
        calls = [c for c in m.tool_calls or [] if c.get("id") in answered]
        if m.tool_calls and not calls and not content:
            continue  # only unanswered calls: providers refuse a call without its result
        if calls:
            message["tool_calls"] = calls
        if m.tool_call_id:
            message["tool_call_id"] = m.tool_call_id
        messages.append(message)
    return messages
