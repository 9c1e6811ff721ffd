"""Input and output screens: a deterministic rules floor, and a provider moderation adapter.

A screen answers with a `Verdict`. The rules floor always runs, needs no network and is the
same everywhere; a moderation endpoint (OpenAI-compatible `/v1/moderations`) can be chained
after it. Policy on errors lives in the workflow: an input screen that errors fails the
turn closed, an output screen that errors fails open.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

_CARD = re.compile(r"(?<!\d)(?:\d[ .\-]?){13,19}(?!\d)")
# Any address-like run, masked or not: `*` counts as part of a local part here. A match
# starts only where a run of local-part characters starts (the leftmost match would anyway):
# without that, every position of a long run without `@` rescans the run (quadratic time).
_EMAIL = re.compile(
    r"(?<![A-Za-z0-9._%+*-])[A-Za-z0-9._%+*-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}"
)
# The one mask the assistant shows (activities/tools.py): the first character, then `***`.
_MASKED_LOCAL = re.compile(r"[A-Za-z0-9]\*\*\*")
# Invisible characters that split a word without showing (soft hyphen, zero-width, marks).
_INVISIBLE = re.compile("[\u00ad\u034f\u180e\u200b-\u200f\u202a-\u202e\u2060-\u2064\ufeff]")
# Spelled-out addresses: `priya [at] example (dot) com`, `priya at example dot com`. A match
# starts only where a run of spaces starts (linear time on a long run of them).
_SPELLED_AT = re.compile(r"(?<!\s)\s*[\[({<]\s*(?:at|@)\s*[\])}>]\s*", re.IGNORECASE)
_SPELLED_DOT = re.compile(r"(?<!\s)\s*[\[({<]\s*(?:dot|\.)\s*[\])}>]\s*", re.IGNORECASE)
_SPACED_AT = re.compile(r"(?<=[A-Za-z0-9*])\s*@\s*(?=[A-Za-z0-9])")
_WORDY = re.compile(
    r"(?<![A-Za-z0-9._%+-])([A-Za-z0-9._%+-]+)\s+at\s+([A-Za-z0-9-]+(?:\s+dot\s+[A-Za-z0-9-]+)+)\b",
    re.IGNORECASE,
)

# Said instead of an answer the output screen withdrew.
RETRACTION_TEXT = (
    "I'm sorry, I can't share that answer. Please ask again, or I can pass this to a person."
)
# Said when the input screen declines a message; the model never sees the message.
DECLINE_TEXT = (
    "I can't help with that request. I can look up your orders and refunds, check returns, "
    "or pass you to a person."
)


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    category: str | None = None
    reason: str | None = None


ALLOW = Verdict(True)


class Screen(Protocol):
    async def check(self, text: str) -> Verdict: ...


def _luhn(digits: str) -> bool:
    total, parity = 0, len(digits) % 2
    for i, ch in enumerate(digits):
        d = int(ch)
        if i % 2 == parity:
            d = d * 2 - 9 if d * 2 > 9 else d * 2
        total += d
    return total % 10 == 0


def normalized(text: str) -> str:
    """What a reader sees: compatibility forms folded (full-width digits and `＠`), invisible
    characters dropped, so a look-alike cannot slip past the rules."""
    return _INVISIBLE.sub("", unicodedata.normalize("NFKC", text))


def contains_unmasked_email(text: str) -> bool:
    """An email address other than the assistant's own mask (`p***@example.com`), also when
    spelled out, spaced or percent-encoded."""
    text = normalized(text).replace("%40", "@")
    text = _SPELLED_DOT.sub(".", _SPELLED_AT.sub("@", text))
    text = _WORDY.sub(lambda m: m[1] + "@" + re.sub(r"\s+dot\s+", ".", m[2], flags=re.I), text)
    text = _SPACED_AT.sub("@", text)
    for match in _EMAIL.finditer(text):
        local = match.group().rsplit("@", 1)[0]
        if not _MASKED_LOCAL.fullmatch(local):
            return True
    return False


def contains_card_number(text: str) -> bool:
    text = normalized(text)
    for match in _CARD.finditer(text):
        digits = re.sub(r"\D", "", match.group())
        if 13 <= len(digits) <= 19 and _luhn(digits):
            return True
    return False


@dataclass(frozen=True)
class RulesScreen:
    """The floor. Input: no payment card numbers (we must not process them), no blocked
    terms. Output: no card numbers, no unmasked email addresses (the assistant only ever
    shows masked ones), no blocked terms."""

    direction: str  # "input" | "output"
    blocked_terms: Sequence[str] = field(default_factory=tuple)

    async def check(self, text: str) -> Verdict:
        lowered = normalized(text).casefold()
        for term in self.blocked_terms:
            if term and normalized(term).casefold() in lowered:
                return Verdict(False, "blocked_term", f"contains a blocked term ({term!r})")
        if contains_card_number(text):
            return Verdict(False, "payment_card", "contains a payment card number")
        if self.direction == "output" and contains_unmasked_email(text):
            return Verdict(False, "personal_data", "contains an unmasked email address")
        return ALLOW


class ModerationScreen:
    """A provider moderation endpoint over HTTP, through the official `openai` SDK (it speaks
    the OpenAI-compatible `/v1/moderations`). Retries belong to the activity, not the SDK."""

    def __init__(self, client: Any, model: str | None = None) -> None:
        self._client = client
        self._model = model

    async def check(self, text: str) -> Verdict:
        kwargs: dict[str, Any] = {"input": text}
        if self._model:
            kwargs["model"] = self._model
        result = await self._client.moderations.create(**kwargs)
        for item in result.results:
            if item.flagged:
                categories = item.categories.model_dump() if item.categories else {}
                flagged = sorted(name for name, hit in categories.items() if hit)
                return Verdict(False, "moderation", ", ".join(flagged) or "flagged")
        return ALLOW


@dataclass(frozen=True)
class ScreenChain:
    """Runs screens in order; the first that declines decides."""

    screens: Sequence[Screen]

    async def check(self, text: str) -> Verdict:
        for screen in self.screens:
            verdict = await screen.check(text)
            if not verdict.allowed:
                return verdict
        return ALLOW
