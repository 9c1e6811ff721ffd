"""The recent window: stored messages grouped into turns and rendered for the prompt.

A turn is a user message and everything after it up to the next user message (the answer,
its tool calls and their results), so a tool result is never separated from the call that
asked for it. The window is the newest turns that fit the recent-turns budget, never wider:
when the rolling summary stops short of it, the turns between them are the window's `gap`,
which the context build folds by code (parley/fold.py), so no turn falls between the summary
and the window and the budget still holds. Tool results older than a few turns are shown
as metadata only; a long older message is cut, with a note of where the rest is.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from parley.context import WindowMessage, fence, unfence
from parley.contracts import MessageStatus
from parley.tokens import MESSAGE_OVERHEAD

Turn = list[WindowMessage]


@dataclass(frozen=True)
class Window:
    turns: list[Turn]
    # seq of the oldest message shown verbatim (None when no earlier turn is shown)
    from_seq: int | None
    # the turns after the summary's end and before the window (a lagging or failed summary)
    gap: list[Turn] = field(default_factory=list)


def group_turns(messages: Sequence[WindowMessage]) -> list[Turn]:
    """Messages (any order) as turns in seq order; messages before the first user message
    and retracted text are left out. A user message stored while tool calls awaited their
    results (a steer, store/steering.py) follows those results: no tool call is ever shown
    without its result after it."""
    turns: list[Turn] = []
    waiting: set[str] = set()  # the tool calls of the last reply, not yet answered
    waiting_in: str | None = None  # the turn of that reply
    held: list[WindowMessage] = []  # its turn's user messages that came while they ran
    for m in sorted(messages, key=lambda m: m.seq):
        if m.status == MessageStatus.retracted or not (m.text or m.tool_calls):
            continue
        if m.role == "user" and waiting and m.turn_id is not None and m.turn_id == waiting_in:
            held.append(m)
            continue
        if m.role == "user":
            turns.append([m])
        elif turns:
            turns[-1].append(m)
        if m.role == "assistant" and m.tool_calls:
            waiting = {str(c.get("id")) for c in m.tool_calls if isinstance(c, dict)}
            waiting_in = m.turn_id
        elif m.role == "tool":
            waiting.discard(str(m.tool_call_id))
        if held and not waiting:
            turns.extend([h] for h in held)
            held.clear()
    turns.extend([h] for h in held)
    return turns


def turn_tokens(turn: Turn) -> int:
    return sum(m.tokens + MESSAGE_OVERHEAD for m in turn)


def choose_window(turns: list[Turn], *, recent_tokens: int, summary_through: int | None) -> Window:
    """The newest turns within `recent_tokens` (at least one), and the turns between
    `summary_through` and them (the gap a lagging summary leaves, to be folded)."""
    chosen: list[Turn] = []
    used = 0
    for turn in reversed(turns):
        cost = turn_tokens(turn)
        if chosen and used + cost > recent_tokens:
            break
        chosen.insert(0, turn)
        used += cost
    start = len(turns) - len(chosen)
    covered = summary_through if summary_through is not None else 0
    gap = [t for t in turns[:start] if t[-1].seq > covered]
    return Window(chosen, chosen[0][0].seq if chosen else None, gap)


def render_turn(
    turn: Turn,
    *,
    aged: bool,
    max_message_tokens: int,
    cut: Callable[[str, int], str],
) -> list[dict[str, Any]]:
    """One turn as canonical messages. A cancelled or incomplete answer is marked so the
    model does not take it as finished; calls without a stored result are left out
    (providers refuse a call without its result)."""
    answered = {m.tool_call_id for m in turn if m.role == "tool"}
    messages: list[dict[str, Any]] = []
    for m in turn:
        content = m.text
        if m.role == "tool":
            content = aged_result(m.text) if aged else fence(m.text)
        elif m.tokens > max_message_tokens:
            content = cut(m.text, max_message_tokens) + (
                f"\n[the rest of this long message (seq {m.seq}, {m.tokens} tokens) is left "
                "out here; it is still in the conversation record]"
            )
        if m.role == "assistant" and m.status in (
            MessageStatus.incomplete,
            MessageStatus.cancelled,
        ):
            content += f"\n[this answer was {m.status}]"
        message: dict[str, Any] = {"role": m.role, "content": content}
        calls = [c for c in m.tool_calls or [] if c.get("id") in answered]
        if m.tool_calls and not calls and not content:
            continue
        if calls:
            message["tool_calls"] = calls
        if m.tool_call_id:
            message["tool_call_id"] = m.tool_call_id
        messages.append(message)
    return messages


def aged_result(text: str) -> str:
    """An older tool result as metadata: tool, arguments, how many items, their ids. The full
    payload stays in the record; calling the tool again reads it afresh."""
    try:
        payload = json.loads(unfence(text))
    except json.JSONDecodeError:
        return fence(json.dumps({"aged": True, "note": "older tool output, not shown"}))
    result = payload.get("result") if isinstance(payload, dict) else None
    items: list[Any] = []
    if isinstance(result, dict):
        lists = [v for v in result.values() if isinstance(v, list)]
        items = lists[0] if lists else [result]
    ids = sorted(
        {
            str(v)
            for item in items
            if isinstance(item, dict)
            for k, v in item.items()
            if k.endswith("_id")
        }
    )
    meta = {
        "aged": True,
        "tool": payload.get("name") if isinstance(payload, dict) else None,
        "result_count": len(items),
        "ids": ids[:10],
        "error": result.get("error", {}).get("code")
        if isinstance(result, dict) and isinstance(result.get("error"), dict)
        else None,
        "note": "older tool result, payload omitted; call the tool again to read it",
    }
    return fence(json.dumps({k: v for k, v in meta.items() if v is not None}, sort_keys=True))


# --- large pastes ---------------------------------------------------------------------------

_PARAGRAPHS = re.compile(r"\n\s*\n")


@dataclass(frozen=True)
class Paste:
    question: str
    chunks: list[str]


def split_paste(text: str, *, chunk_tokens: int, count: Callable[[str], int]) -> Paste:
    """A long message as the question (its short first or last paragraph) and chunks of the
    rest of about `chunk_tokens` each."""
    paragraphs = [p.strip() for p in _PARAGRAPHS.split(text) if p.strip()]
    question = ""
    if len(paragraphs) > 1 and count(paragraphs[-1]) <= 150:
        question = paragraphs.pop()
    elif len(paragraphs) > 1 and count(paragraphs[0]) <= 150:
        question = paragraphs.pop(0)
    return Paste(
        question, chunk_text("\n\n".join(paragraphs), chunk_tokens=chunk_tokens, count=count)
    )


def chunk_text(text: str, *, chunk_tokens: int, count: Callable[[str], int]) -> list[str]:
    """Text in chunks of about `chunk_tokens` each, cut at paragraphs, then lines, then words
    (a paste's body; an attached file too long for its share of the prompt)."""
    paragraphs = [p.strip() for p in _PARAGRAPHS.split(text) if p.strip()]
    pieces: list[str] = []
    for paragraph in paragraphs:
        pieces += _split_long(paragraph, chunk_tokens, count)
    chunks: list[str] = []
    current: list[str] = []
    size = 0
    for piece in pieces:
        cost = count(piece)
        if current and size + cost > chunk_tokens:
            chunks.append("\n\n".join(current))
            current, size = [], 0
        current.append(piece)
        size += cost
    if current:
        chunks.append("\n\n".join(current))
    return chunks


def _split_long(paragraph: str, chunk_tokens: int, count: Callable[[str], int]) -> list[str]:
    if count(paragraph) <= chunk_tokens:
        return [paragraph]
    lines = paragraph.splitlines() or [paragraph]
    if len(lines) == 1:
        words = paragraph.split()
        step = max(1, len(words) * chunk_tokens // max(1, count(paragraph)))
        return [" ".join(words[i : i + step]) for i in range(0, len(words), step)]
    return [piece for line in lines for piece in _split_long(line, chunk_tokens, count)]


def relevance(chunk: str, terms: Sequence[str]) -> int:
    """How many of the question's terms a chunk contains (word prefixes, case-insensitive)."""
    words = {w.lower() for w in re.findall(r"[A-Za-z0-9]+", chunk)}
    return sum(1 for t in terms if any(w.startswith(t[:6]) for w in words))
