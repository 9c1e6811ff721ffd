"""The code summarizer: a conversation folded into summary lines without a model.

Extractive and deterministic: what the user said (first sentence), what the assistant
answered (first sentence), what each tool was asked and found (tool, order, outcome), and the
facts the user stated, by the patterns code pins them with. Three callers share it:

- the demo model answers the summarizer's prompt with it (gateway/demo.py);
- the rolling summary falls back to it when the model's summary is unusable, even after one
  repair (activities/memory.py; the row says `written_by: fallback`), and uses it without
  asking the model for a while after that (`ask_the_model`);
- the context build folds the turns between a lagging summary and the recent window with it,
  so the conversation budget is a ceiling whatever the summarizer does (parley/prompt.py).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from typing import Any

from parley.context import unfence
from parley.memory import PinnedFact, SummaryLine, extract_facts, line_refs

# Who wrote a summary that no model wrote.
FALLBACK = "fallback"


def ask_the_model(fallbacks_in_a_row: int, every: int) -> bool:
    """Whether a summary run asks the model, given how many of the session's latest versions
    the code wrote in a row. A model that answered the schema with prose twice (the question
    and its repair) will almost always do so again: asking costs two requests of the whole
    transcript per run for nothing. So after a fallback the code writes the next versions
    directly, and the model is asked again every `every`-th run (a provider may recover; a
    tenant may switch models). `every` 1 asks every time."""
    return every <= 1 or fallbacks_in_a_row % every == 0


_SENTENCE = re.compile(r"(?<=[.!?])\s+")


def first_sentence(text: str, words: int = 30) -> str:
    first = _SENTENCE.split(" ".join(text.split()), maxsplit=1)[0]
    cut = first.split()
    return " ".join(cut[:words]) + (" …" if len(cut) > words else "")


def extractive_summary(transcript: list[dict[str, Any]]) -> dict[str, Any]:
    """The summary as the summarizer's JSON answer: {"lines": [...], "facts": [...]}."""
    lines: list[dict[str, Any]] = []
    facts: list[dict[str, Any]] = []
    for m in transcript:
        seq, role, text = int(m["seq"]), m["role"], str(m.get("text") or "")
        if role == "user" and text:
            lines.append({"seq": seq, "text": f'The user said: "{first_sentence(text)}"'})
            facts += [
                {"key": f.key, "value": f.value, "seq": seq} for f in extract_facts(text, seq)
            ]
        elif role == "assistant" and text:
            lines.append({"seq": seq, "text": f"The assistant answered: {first_sentence(text)}"})
        elif role == "tool":
            lines.append({"seq": seq, "text": tool_line(text)})
    return {"lines": lines, "facts": facts}


def fold(transcript: list[dict[str, Any]]) -> tuple[list[SummaryLine], list[PinnedFact]]:
    """The same summary as typed lines and facts (what `parse_summary` returns)."""
    data = extractive_summary(transcript)
    lines = [SummaryLine(x["seq"], x["text"], line_refs(x["text"])) for x in data["lines"]]
    facts = [PinnedFact(x["key"], x["value"], x["seq"]) for x in data["facts"]]  # patterns
    return lines, facts


def gap_lines(transcript: list[dict[str, Any]]) -> list[SummaryLine]:
    """The compact fold of a lagging summary's gap, for the prompt: what the user said (its
    first sentence, at most 20 words) and what tools found; not the assistant's words (its
    next answer can restate them, and a lag is a few turns at most)."""
    lines = []
    for m in transcript:
        seq, role, text = int(m["seq"]), m["role"], str(m.get("text") or "")
        if role == "user" and text:
            said = f"user: {first_sentence(text, 20)}"
            lines.append(SummaryLine(seq, said, line_refs(said)))
        elif role == "tool":
            found = tool_line(text)
            lines.append(SummaryLine(seq, found, line_refs(found)))
    return lines


def within(
    lines: list[SummaryLine], *, max_tokens: int, count: Callable[[str], int]
) -> tuple[list[SummaryLine], list[SummaryLine]]:
    """The lines a budget holds, and those it does not. What the user said and what tools
    found go first, newest first; the assistant's own words only where room is left (the
    next answer can restate them; what the user said cannot be asked again)."""
    ranked = sorted(lines, key=lambda line: (_is_answer(line), -line.seq))
    kept: list[SummaryLine] = []
    used = 0
    for line in ranked:
        cost = count(line.text) + 8
        if used + cost <= max_tokens:
            kept.append(line)
            used += cost
    left = [line for line in lines if line not in kept]
    return sorted(kept, key=lambda line: line.seq), left


def _is_answer(line: SummaryLine) -> bool:
    return line.text.startswith("The assistant answered:")


def tool_line(text: str) -> str:
    """A tool result as one line of metadata: the tool, the orders it was about, its status."""
    try:
        payload = json.loads(unfence(text))
    except json.JSONDecodeError:
        return "A tool answered."
    if not isinstance(payload, dict):
        return "A tool answered."
    name, result = payload.get("name"), payload.get("result") or {}
    if isinstance(result, dict) and "error" in result:
        return f"Tool {name} failed ({(result.get('error') or {}).get('code')})."
    ids = sorted({str(v) for k, v in _flat_items(result) if k == "order_id"})
    about = f" for order {', '.join(ids)}" if ids else ""
    status = result.get("status") if isinstance(result, dict) else None
    return f"Tool {name} answered{about}" + (f": status {status}." if status else ".")


def _flat_items(value: Any) -> Iterable[tuple[str, Any]]:
    if isinstance(value, dict):
        return [*value.items(), *(i for v in value.values() for i in _flat_items(v))]
    if isinstance(value, list):
        return [i for v in value for i in _flat_items(v)]
    return []
