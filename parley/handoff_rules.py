"""A tenant's rules for hand-offs opened by code, not by the model (parley/handoffs.py).

Three openers besides the model's `handoff_to_human` call (`by` of a case):

- `user_asked`: the customer's message plainly asks for a person ("talk to a person", "real
  person", or the tenant's own phrases). The POST opens the case (store/posting.py), so no
  turn starts and the model is not asked: a customer who asked for a human gets one even from
  a model that would not call the tool.
- `policy`: the assistant keeps failing the customer: the order system was down for the
  last `tool_outages` tool calls of the session in a row, or the output screen withdrew
  `retractions` answers. Counted since the session's last case, so a case ended by a person
  does not reopen at the very next turn. Decided as a turn ends (activities/ending.py).

Defaults, on for every tenant: 3 outages in a row (each call was already retried, so three
means the system has been down across several of the customer's questions, and the
assistant can only apologise), 2 retractions (as the issue puts it: one can be a screen's
false alarm, two in a conversation are a pattern a person should look at), and the English
phrases below. A tenant sets 0 (or `[]` for the phrases) to turn one off.

A case's priority (the inbox sorts by it, then by age): the opener's (`priorities`, by
default 1 for the model's call and for a customer who asked, 2 for a policy case: the
assistant has already failed them), plus one when the reason names one of the tenant's
`urgent_words`.
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import BaseModel, ConfigDict, Field, field_validator

from parley.business_hours import SPAN_PATTERN, BusinessWeek, check_span
from parley.wire import Integral


class OpenedBy(StrEnum):
    tool = "tool"  # the model's `handoff_to_human`
    user_asked = "user_asked"  # the customer's own words (`asks_for_person`)
    policy = "policy"  # repeated tool outages or retractions


# What a customer plainly asking for a human says, lower case; matched as whole words, in
# order, with anything but a sentence's end between them ("talk to a real person").
ASK_PHRASES_EN: tuple[str, ...] = (
    "talk to a person",
    "talk to a human",
    "talk to an agent",
    "talk to someone",
    "speak to a person",
    "speak to a human",
    "speak to an agent",
    "speak with a person",
    "speak with a human",
    "real person",
    "real human",
    "human agent",
    "a human please",
    "customer service representative",
)

# Words that turn a phrase around: "I don't want to talk to a person" asks for nothing.
NEGATIONS = frozenset({"not", "don't", "dont", "never", "no", "without", "doesn't", "didn't"})

DEFAULT_PRIORITIES: dict[str, int] = {
    OpenedBy.tool.value: 1,
    OpenedBy.user_asked.value: 1,
    OpenedBy.policy.value: 2,
}
MAX_PRIORITY = 9

# The reasons a policy case gives the person, written by code.
OUTAGES_REASON = (
    "Opened by policy: the order system did not answer the assistant's last {n} lookups in "
    "a row, so the assistant could not help with the customer's question."
)
RETRACTIONS_REASON = (
    "Opened by policy: the output screen withdrew {n} of the assistant's answers in this "
    "conversation; a person should check what the customer needs."
)
ASKED_REASON = "The customer asked for a person: “{text}”"


Day = Literal["mon", "tue", "wed", "thu", "fri", "sat", "sun"]


class BusinessHours(BaseModel):
    """When the support team works (parley/business_hours.py): a case's claim clock runs only
    then, and a customer who writes outside them is told when a person will be back."""

    model_config = ConfigDict(extra="forbid", strict=True)

    time_zone: str = Field(max_length=64)  # an IANA zone, e.g. "Europe/Berlin"
    # "HH:MM-HH:MM" per open day; others closed.
    days: dict[Day, Annotated[str, Field(pattern=SPAN_PATTERN)]] = Field(min_length=1)

    @field_validator("time_zone")
    @classmethod
    def _known_zone(cls, value: str) -> str:
        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError) as exc:
            raise ValueError(f"{value!r} is not a known time zone") from exc
        return value

    @field_validator("days")
    @classmethod
    def _spans(cls, value: dict[str, str]) -> dict[str, str]:
        for span in value.values():
            check_span(span)
        return value

    def week(self) -> BusinessWeek:
        days: dict[str, str] = dict(self.days.items())
        return BusinessWeek(self.time_zone, days)


class HandoffRules(BaseModel):
    """`handoff_rules` of a tenant's config; every field has the default described above."""

    model_config = ConfigDict(extra="forbid", strict=True)

    # Tool calls in a row that found the order system down before a case opens; 0: never.
    tool_outages: Integral = Field(default=3, ge=0, le=50)
    # Answers withdrawn by the output screen (since the last case) before one opens; 0: never.
    retractions: Integral = Field(default=2, ge=0, le=50)
    # What a customer asking for a person says (lower case); None: `ASK_PHRASES_EN`, []: off.
    ask_phrases: list[str] | None = Field(default=None, max_length=100)
    # A case's priority by what opened it (unnamed openers keep `DEFAULT_PRIORITIES`).
    priorities: dict[Literal["tool", "user_asked", "policy"], Integral] | None = None
    # Words in a case's reason that raise its priority by one.
    urgent_words: list[str] = Field(default_factory=list, max_length=50)
    # The team's weekly hours; None: the claim clock always runs.
    business_hours: BusinessHours | None = None

    def week(self) -> BusinessWeek | None:
        """The team's hours as a case's workflow carries them; None: the clock always runs."""
        return self.business_hours.week() if self.business_hours else None

    def phrases(self) -> tuple[str, ...]:
        return ASK_PHRASES_EN if self.ask_phrases is None else tuple(self.ask_phrases)

    def priority(self, by: OpenedBy, reason: str) -> int:
        chosen = dict(DEFAULT_PRIORITIES)
        for opener, value in (self.priorities or {}).items():
            chosen[opener] = value
        base = chosen[by.value]
        words = set(_words(reason))
        urgent = any(set(_words(w)) and set(_words(w)) <= words for w in self.urgent_words)
        return max(0, min(MAX_PRIORITY, base + int(urgent)))


def asks_for_person(text: str, phrases: tuple[str, ...]) -> bool:
    """Whether the message plainly asks for a person: one of `phrases`, its words in order
    within one sentence (up to two other words between two of them: "talk to a real
    person"), and no negation before them in that sentence ("I don't need a real person")."""
    for sentence in re.split(r"[.,!?;\n]+", text.lower()):
        said = _words(sentence)
        for phrase in phrases:
            wanted = _words(phrase)
            start = _in_order(wanted, said, gap=2) if wanted else None
            if start is not None and not NEGATIONS.intersection(said[:start]):
                return True
    return False


def _words(text: str) -> list[str]:
    return re.findall(r"[\w']+", text.lower())


def _in_order(wanted: list[str], said: list[str], *, gap: int) -> int | None:
    """Where `wanted` starts in `said`, its words in order with at most `gap` other words
    between two of them; None when it does not occur."""
    for start, word in enumerate(said):
        if word != wanted[0]:
            continue
        at, ok = start, True
        for next_word in wanted[1:]:
            window = said[at + 1 : at + 2 + gap]
            if next_word not in window:
                ok = False
                break
            at = at + 1 + window.index(next_word)
        if ok:
            return start
    return None


def policy_reason(rules: HandoffRules, *, outages: int, retractions: int) -> str | None:
    """The reason a policy case opens for, given what the session counts since its last
    case (`outages`: how many of its last `rules.tool_outages` tool calls found the order
    system down); None: no rule is met."""
    if rules.tool_outages and outages >= rules.tool_outages:
        return OUTAGES_REASON.format(n=outages)
    if rules.retractions and retractions >= rules.retractions:
        return RETRACTIONS_REASON.format(n=retractions)
    return None


def asked_reason(text: str) -> str:
    flat = " ".join(text.split())
    return ASKED_REASON.format(text=flat if len(flat) <= 200 else flat[:199] + "…")
