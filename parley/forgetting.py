"""Forgetting one message, as pure rules: what goes with it, and how a stored copy of its text
is scrubbed out of a JSON record (a prompt, a tool call, a trace span).

- Forgetting a **user message** forgets its exchange: the message and every assistant and tool
  message of the turns that answered it (a retry answers the same message), because an answer
  is written from the question and often repeats it. Forgetting an **assistant** or **tool**
  message forgets that message alone.
- The text of a forgotten message, and of every copy derived from it (a pinned fact's value, a
  memory item's value, a summary line written from it), is a *needle*: each occurrence in a
  later prompt or a trace span's attributes is replaced by `FORGOTTEN`, as a whole word where
  the needle starts or ends with one, so the record keeps its shape and loses the words.
- The events that streamed a forgotten message keep their ids (a replay's numbering does not
  change) but carry no text: a `delta` appends "", `done` and `cancelled` name a message
  with empty text, a clarification or interaction asks nothing, follow-ups suggest nothing.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

from parley.fold import first_sentence

FORGOTTEN = "[forgotten]"

# What a forgotten message's events keep: the fields that carry no text.
_EMPTIED: dict[str, dict[str, Any]] = {
    "delta": {"text": ""},
    "retracted": {"replacement_text": ""},
    "clarification": {"question": "", "options": []},
    "interaction": {"question": "", "options": []},
    "followups": {"suggestions": []},
}


@dataclass(frozen=True)
class Forgotten:
    """What forgetting one message removed, by kind (the route's answer; counts of rows)."""

    messages: int = 0
    events: int = 0
    embeddings: int = 0
    summaries: int = 0
    pinned_facts: int = 0
    memory_items: int = 0
    prompts: int = 0
    trace_spans: int = 0
    tool_calls: int = 0
    result_sets: int = 0
    feedback: int = 0
    # Files, not rows: `parley eval capture` drafts captured in the session
    # (store/lifecycle/eval_drafts.py).
    eval_drafts: int = 0

    def as_json(self) -> dict[str, int]:
        return asdict(self)


class Scrubber:
    """Replaces every occurrence of the needles in the strings of a JSON value."""

    def __init__(self, needles: Iterable[str]) -> None:
        kept = sorted({n.strip() for n in needles if n and n.strip()}, key=len, reverse=True)
        self._pattern = re.compile("|".join(_bounded(n) for n in kept)) if kept else None

    def __bool__(self) -> bool:
        return self._pattern is not None

    def text(self, value: str) -> str:
        return value if self._pattern is None else self._pattern.sub(FORGOTTEN, value)

    def json(self, value: Any) -> Any:
        """`value` with every string scrubbed (dict keys are the record's own, kept)."""
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, list):
            return [self.json(item) for item in value]
        if isinstance(value, dict):
            return {key: self.json(item) for key, item in value.items()}
        return value


def needles_of(text: str) -> set[str]:
    """The forms a message's text is copied into a prompt in: whole (the window, recall), and
    the excerpts the code summarizer and a lagging summary's fold quote (its first sentence,
    cut at 30 and at 20 words: parley/fold.py), without the cut's ellipsis."""
    if not text.strip():
        return set()
    return {text, *(first_sentence(text, words).removesuffix(" …") for words in (30, 20))}


def _bounded(needle: str) -> str:
    """The needle as a pattern, held to word boundaries at an end that is a word character
    ("Pri" is not forgotten out of "Priority")."""
    start = r"(?<!\w)" if needle[0].isalnum() or needle[0] == "_" else ""
    end = r"(?!\w)" if needle[-1].isalnum() or needle[-1] == "_" else ""
    return start + re.escape(needle) + end


def emptied_event(
    type_: str, data: dict[str, Any], forgotten: set[str], *, whole_turn: bool
) -> dict[str, Any] | None:
    """A stored event's payload without the text of a forgotten message, or None when it has
    none to lose. `forgotten` holds the message ids; `whole_turn`: the event's turn answered a
    forgotten user message, so its events without a message id (a clarification, follow-ups)
    lose their text too."""
    if type_ in ("done", "cancelled"):
        message = dict(data.get("message") or {})
        if message.get("id") not in forgotten:
            return None
        return {**data, "message": {**message, "text": "", "tool_calls": None}}
    if "message_id" in data:
        if data["message_id"] not in forgotten:
            return None
    elif not whole_turn:
        return None
    emptied = _EMPTIED.get(type_)
    return None if emptied is None else {**data, **emptied}
