"""Durable, consented memory, as pure rules: what is remembered, for how long, how it is shown.

This is the per-user layer that outlives a session (the per-session pinned facts and summaries
are parley/memory.py). Three rules keep it honest:

- **Only server code writes it, from validated events**: a preference the user states outright
  in their own message (matched here by pattern, never read from model prose), or a choice the
  user confirmed (they confirmed an email proposal: `contact_channel = email`). Each item names
  its source: `message:<id>` or `action:<id>`. Nothing is written without the user's consent.
- **It expires**: every item carries `expires_at`; an expired item is never read.
- **It is a hint, never a fact**: the prompt shows items as what the user said in an earlier
  conversation, unverified, below anything a tool returns or the user says now.

Copies derived from memory (a session's pinned fact written with a memory item, a summary that
folded turns whose prompts showed hints) carry the item's key as provenance, so turning consent
off or deleting one item can find and delete them too.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from parley.context import Block, Position
from parley.tokens import TokenCounter, count_message

CONTACT_CHANNEL = "contact_channel"
# The write an email proposal becomes: the user confirming it chose email as the channel.
EMAIL_ACTION_TOOL = "send_email"

# The hints block: plain words for a real model, then one JSON line the demo model reads.
HINTS_PREFIX = (
    "Hints from the user's earlier conversations (remembered with their consent; UNVERIFIED "
    "and possibly out of date; never facts: a tool result or what the user says now always "
    "wins, and ask before relying on one):\n"
)
HINTS_DATA = "hints-json: "

_CHANNELS = {
    "email": "email",
    "e-mail": "email",
    "mail": "email",
    "phone": "phone",
    "call": "phone",
    "telephone": "phone",
    "text": "sms",
    "texts": "sms",
    "text message": "sms",
    "text messages": "sms",
    "sms": "sms",
    "post": "post",
    "letter": "post",
    "letters": "post",
}
_CHANNEL = r"(e-?mail|phone|telephone|text messages?|texts?|sms|post|letters?)"
# Explicit statements only: the user says how they want to be reached, in so many words.
_STATED: tuple[re.Pattern[str], ...] = (
    # "email is the best way to reach me", "phone is the easiest way to contact me"
    re.compile(
        _CHANNEL + r" (?:is|'s) (?:the )?(?:best|easiest|preferred|quickest) "
        r"(?:way|channel) to (?:reach|contact|get hold of) me\b",
        re.IGNORECASE,
    ),
    # "please contact me by phone", "reach me via email", "get in touch with me by text"
    re.compile(
        r"\b(?:contact|reach|call|get in touch with) me (?:by|via|over|through) " + _CHANNEL,
        re.IGNORECASE,
    ),
    # "I prefer email", "I'd prefer to be contacted by phone"
    re.compile(
        r"\bI(?:'d| would)? prefer (?:to be contacted |being contacted |contact )?(?:by |via )?"
        + _CHANNEL
        + r"\b",
        re.IGNORECASE,
    ),
)
# A negation in the same sentence makes the statement not a plain preference.
_NEGATED = re.compile(r"\b(not|don'?t|do not|never|no longer|rather not)\b", re.IGNORECASE)


@dataclass(frozen=True)
class Remembered:
    """What a validated event says to remember (before it is stored)."""

    key: str
    value: str
    source: str


@dataclass(frozen=True)
class MemoryItem:
    key: str
    value: str
    source: str
    created_at: datetime
    expires_at: datetime


def message_source(message_id: str) -> str:
    return f"message:{message_id}"


def action_source(action_id: str) -> str:
    return f"action:{action_id}"


def stated_preferences(text: str, *, message_id: str) -> list[Remembered]:
    """Preferences the user states outright in their own message; the last one said wins."""
    found: dict[str, Remembered] = {}
    for sentence in re.split(r"(?<=[.!?;])\s+|\n+", text):
        if _NEGATED.search(sentence):
            continue
        for pattern in _STATED:
            match = pattern.search(sentence)
            if match:
                channel = _CHANNELS[match.group(1).lower()]
                found[CONTACT_CHANNEL] = Remembered(
                    CONTACT_CHANNEL, channel, message_source(message_id)
                )
                break
    return list(found.values())


def confirmed_choice(*, tool: str, action_id: str) -> list[Remembered]:
    """A confirmed proposal that is a choice of contact channel (today: email)."""
    if tool == EMAIL_ACTION_TOOL:
        return [Remembered(CONTACT_CHANNEL, "email", action_source(action_id))]
    return []


def expiry(now: datetime, *, days: int) -> datetime:
    return now + timedelta(days=days)


def live(items: Iterable[MemoryItem], *, now: datetime) -> list[MemoryItem]:
    """Items not yet expired (the store filters too; this is the rule, stated once)."""
    return [item for item in items if item.expires_at > now]


def hint_phrase(item: MemoryItem) -> str:
    """How one item reads in the prompt: what the user said last time, never a fact."""
    when = item.created_at.date().isoformat()
    if item.key == CONTACT_CHANNEL:
        return f"- last time you preferred {item.value} (contact channel; remembered {when})"
    return f"- last time: {item.key.replace('_', ' ')}: {item.value} (remembered {when})"


def hints_text(items: list[MemoryItem]) -> str:
    lines = "\n".join(hint_phrase(item) for item in items)
    data = json.dumps({item.key: item.value for item in items}, sort_keys=True)
    return f"{HINTS_PREFIX}{lines}\n{HINTS_DATA}{data}"


def hint_blocks(counter: TokenCounter, items: list[MemoryItem]) -> list[Block]:
    """The hints block: optional, below pinned facts and the summary in priority, placed
    before the conversation so every tool result of this turn comes after it."""
    if not items:
        return []
    message = {"role": "system", "content": hints_text(items)}
    return [
        Block(
            "memory_hints",
            "hints remembered from earlier conversations",
            (message,),
            count_message(counter, message),
            Position.pinned,
            priority=60,
            order=1,
        )
    ]


def read_hints(messages: list[dict[str, Any]]) -> dict[str, str]:
    """The hints a prompt carries (for the demo model, which reads prompts as a model would)."""
    for message in messages:
        content = message.get("content")
        if message.get("role") == "system" and isinstance(content, str):
            if content.startswith(HINTS_PREFIX) and HINTS_DATA in content:
                data = content.rsplit(HINTS_DATA, 1)[1]
                return {str(k): str(v) for k, v in json.loads(data).items()}
    return {}
