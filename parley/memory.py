"""Conversational memory, as pure rules: pinned facts, the rolling summary, recall terms.

- **Pinned facts** are what the user says about themselves ("call me Pri", "I prefer email").
  Code writes them, from explicit patterns or from the summarizer's structured output after
  checking that the value is in the user's own words at the seq it names; never from model
  prose alone. One value per key: a later statement replaces an earlier one.
- **The rolling summary** is a list of lines, each with the seq it came from and the slot
  values it mentions (`refs`). A line about a referent that has since changed is stale: the
  slot outranks it, and the line is not sent.
- **Recall terms** turn the current message (and the slots) into a full-text query.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from jsonschema import Draft202012Validator

# The summarizer's task: the demo model recognises it by this first line.
SUMMARY_TASK = "TASK: summarize-conversation v1"
SUMMARY_INSTRUCTIONS = (
    SUMMARY_TASK
    + "\nYou maintain the running summary of a support conversation. You get a JSON list of "
    "messages [{seq, role, text}]. Answer with JSON only: "
    '{"lines": [{"seq": <source seq>, "text": <one short sentence>}], '
    '"facts": [{"key": <snake_case>, "value": <exact words of the user>, "seq": <seq>}]}. '
    "Lines keep what the user asked, stated or decided, and what tools found (tool, order, "
    "outcome); facts are only what the user said about themselves or their preferences."
)

# The summarizer's answer, as a schema both providers' structured-output modes take (strict:
# every property required, no others) and the answer is validated against.
SUMMARY_SCHEMA_NAME = "conversation_summary"
SUMMARY_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "lines": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"seq": {"type": "integer"}, "text": {"type": "string"}},
                "required": ["seq", "text"],
                "additionalProperties": False,
            },
        },
        "facts": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "key": {"type": "string"},
                    "value": {"type": "string"},
                    "seq": {"type": "integer"},
                },
                "required": ["key", "value", "seq"],
                "additionalProperties": False,
            },
        },
    },
    "required": ["lines", "facts"],
    "additionalProperties": False,
}

_ORDER_REF = re.compile(r"\b(?:order\s*#?\s*)?(\d{4,6})\b", re.IGNORECASE)
# The slot whose value a summary line's order reference is checked against.
ORDER_SLOT = "active_order_id"

_FACT_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("preferred_name", re.compile(r"\bcall me ([A-Z][\w'-]{0,30})", re.IGNORECASE)),
    ("name", re.compile(r"\bmy name is ([A-Z][\w'-]{0,30})", re.IGNORECASE)),
    (
        "account_nickname",
        re.compile(r"\bmy (?:account )?nickname is [\"']?([\w'-]{1,40})", re.IGNORECASE),
    ),
    (
        "contact_preference",
        re.compile(
            r"\bI(?:'d| would)? prefer (?:to be contacted by |contact by |being contacted by )?"
            r"(e-?mail|phone|text messages?|sms|post|letters?)\b",
            re.IGNORECASE,
        ),
    ),
)

_STOPWORDS = frozenset(
    "a about after again all am an and any are as at be been before but by can could did do "
    "does for from had has have he her here hers him his how i if in into is it its me my no "
    "not of on or our she so some than that the their them then there these they this those "
    "to too up us was we were what when where which who whom why will with would you your "
    "yours please thanks thank just also still".split()
)
_WORDS = re.compile(r"[A-Za-z0-9][A-Za-z0-9'-]*")


@dataclass(frozen=True)
class PinnedFact:
    key: str
    value: str
    seq: int
    source: str = "pattern"


@dataclass(frozen=True)
class SummaryLine:
    seq: int
    text: str
    refs: dict[str, str] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def extract_facts(text: str, seq: int) -> list[PinnedFact]:
    """Facts a user message states outright, by pattern."""
    found: dict[str, PinnedFact] = {}
    for key, pattern in _FACT_PATTERNS:
        match = pattern.search(text)
        if match:
            value = match.group(1).strip().rstrip(".,!")
            if key == "contact_preference":
                value = value.lower().replace("e-mail", "email")
            found[key] = PinnedFact(key, value, seq)
    return list(found.values())


def merge_facts(current: Iterable[PinnedFact], new: Iterable[PinnedFact]) -> list[PinnedFact]:
    """One value per key; a later statement (higher seq) replaces an earlier one."""
    merged = {f.key: f for f in current}
    for fact in new:
        if fact.key not in merged or merged[fact.key].seq <= fact.seq:
            merged[fact.key] = fact
    return sorted(merged.values(), key=lambda f: f.key)


def facts_text(facts: Iterable[PinnedFact]) -> str:
    lines = [f"- {f.key.replace('_', ' ')}: {f.value} (said at seq {f.seq})" for f in facts]
    return "What the user told us about themselves (pinned, newest statement wins):\n" + "\n".join(
        lines
    )


def line_refs(text: str) -> dict[str, str]:
    """The slot values a summary line is about (today: an order number)."""
    match = _ORDER_REF.search(text)
    return {ORDER_SLOT: match.group(1)} if match else {}


def fresh_lines(
    lines: Iterable[SummaryLine], slots: dict[str, tuple[Any, int]]
) -> list[SummaryLine]:
    """Drop lines about a slot whose value changed after the line was written.

    `slots` maps a slot name to (value, set_at_seq). A line mentioning order 8123 when the
    active order became 8390 at a later seq is stale: the slot outranks the summary."""
    kept = []
    for line in lines:
        stale = False
        for name, ref in line.refs.items():
            if name in slots:
                value, set_at = slots[name]
                stale = stale or (str(value) != ref and set_at > line.seq)
        if not stale:
            kept.append(line)
    return kept


def summary_text(lines: Iterable[SummaryLine], *, through_seq: int) -> str:
    body = "\n".join(f"- [seq {line.seq}] {line.text}" for line in lines)
    return f"Summary of the conversation up to seq {through_seq} (older turns, condensed):\n{body}"


def cap_lines(
    lines: list[SummaryLine], *, max_tokens: int, count: Callable[[str], int]
) -> list[SummaryLine]:
    """Keep the newest lines that fit `max_tokens`: the summary never grows without bound."""
    kept: list[SummaryLine] = []
    used = 0
    for line in reversed(lines):
        cost = count(line.text) + 8
        if used + cost > max_tokens:
            break
        kept.append(line)
        used += cost
    return list(reversed(kept))


def summary_request(transcript: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The summarizer's prompt: instructions, then the messages to fold in, as JSON."""
    return [
        {"role": "system", "content": SUMMARY_INSTRUCTIONS},
        {"role": "user", "content": json.dumps(transcript, ensure_ascii=False)},
    ]


def is_summary_request(messages: list[dict[str, Any]]) -> bool:
    first = messages[0].get("content") if messages else None
    return isinstance(first, str) and first.startswith(SUMMARY_TASK)


def repair_request(
    transcript: list[dict[str, Any]], answer: str, error: str
) -> list[dict[str, Any]]:
    """The one repair: the same prompt, the unusable answer, and what was wrong with it."""
    return [
        *summary_request(transcript),
        {"role": "assistant", "content": answer[:4000]},
        {
            "role": "user",
            "content": f"That answer is not usable: {error}. Answer again with the JSON object "
            "only, exactly as the instructions say: no prose, no code fence.",
        },
    ]


def parse_summary(
    answer: str, transcript: list[dict[str, Any]]
) -> tuple[list[SummaryLine], list[PinnedFact]]:
    """Read the summarizer's JSON, checked against `SUMMARY_SCHEMA` (a ValueError says what
    is wrong, for the repair prompt); keep only lines about seqs it was given, and facts whose
    value the user actually wrote at that seq (code checks; model prose alone pins nothing)."""
    start, end = answer.find("{"), answer.rfind("}")
    if start < 0 or end < start:
        raise ValueError("the summarizer did not answer with JSON")
    data = json.loads(answer[start : end + 1])  # JSONDecodeError is a ValueError
    problem = next(iter(_VALIDATOR.iter_errors(data)), None)
    if problem is not None:
        where = "/".join(str(p) for p in problem.absolute_path) or "the answer"
        raise ValueError(f"{where}: {problem.message}")
    by_seq = {int(m["seq"]): m for m in transcript}
    lines = [
        SummaryLine(int(item["seq"]), str(item["text"])[:400], line_refs(str(item["text"])))
        for item in data.get("lines", [])
        if int(item.get("seq", -1)) in by_seq
    ]
    facts = []
    for item in data.get("facts", []):
        source = by_seq.get(int(item.get("seq", -1)))
        value = str(item.get("value", "")).strip()
        key = re.sub(r"[^a-z0-9_]", "", str(item.get("key", "")).lower())[:40]
        if source is None or source["role"] != "user" or not value or not key:
            continue
        if value.lower() in str(source["text"]).lower():
            facts.append(PinnedFact(key, value, int(item["seq"]), "summarizer"))
    return sorted(lines, key=lambda line: line.seq), facts


_VALIDATOR = Draft202012Validator(SUMMARY_SCHEMA)


def recall_terms(text: str, *, slot_values: Iterable[str] = ()) -> list[str]:
    """The query for recall: content words of the message, plus the referents in the slots
    (so "when did it arrive?" also searches for the order it is about)."""
    words = [w.lower().strip("'-") for w in _WORDS.findall(text)]
    terms = [w for w in words if len(w) >= 3 and w not in _STOPWORDS]
    terms += [re.sub(r"[^A-Za-z0-9]", "", str(v)).lower() for v in slot_values]
    seen: dict[str, None] = {}
    for term in terms:
        if term and term not in seen:
            seen[term] = None
    return list(seen)[:24]
