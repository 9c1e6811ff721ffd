"""The conversation budget: how many of the prompt's tokens the conversation gets, and how
they are split between recalled lines and the recent turns.

A fixed budget either wastes tokens on a short chat or starves a long one: five recalled
lines cannot hold what a 300-turn conversation said. So the budget follows what there is
to remember, the session's distinct text before this turn (each text counted once: a
canned reply said forty times is one thing to remember), as a share of it between a floor
and a ceiling:

    conversation = clamp(share * remembered, floor, ceiling)

A short chat stays on the floor, so turn 60 of a chat of short messages costs what turn 10
did; the ceiling bounds the prompt of any conversation, however long.

Within that budget, a question that reaches back (its words are not in the last turns) is
answered from recall, not from the recent window, so recall gets most of the share; a
follow-up about the last turns keeps the floor's split (recall's share of the floor).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

# How many of the newest turns a question is compared with to tell whether it reaches back.
RECENT_TURNS = 3
# A question reaches back when fewer than this share of its words are in those turns.
REACH_BACK_BELOW = 0.5

# A word is one of the conversation's constants only once it has this many messages or more.
CONSTANT_AFTER = 5

_WORD = re.compile(r"[a-z0-9]+")


@dataclass(frozen=True)
class BudgetRule:
    """The rule's numbers, as configured: settings, then the tenant's overrides (their defaults
    and what they mean: parley/config.py; put together in activities/recall.py
    `budget_rule`)."""

    floor: int
    ceiling: int
    share: float
    # Recall's tokens at the floor for a follow-up; the split scales with the budget.
    recall_at_floor: int
    # Recall's share of the conversation budget when the question reaches back.
    reach_back_recall: float

    def conversation(self, remembered: int) -> int:
        """The conversation's tokens for a session with `remembered` distinct tokens."""
        return max(self.floor, min(self.ceiling, round(self.share * max(remembered, 0))))

    def recall(self, conversation: int, *, reaches_back: bool) -> int:
        """Recall's tokens within a `conversation` budget."""
        follow_up = round(conversation * self.recall_at_floor / max(self.floor, 1))
        if not reaches_back:
            return follow_up
        return max(follow_up, round(conversation * self.reach_back_recall))


def reaches_back(
    terms: Iterable[str], recent: Iterable[tuple[str, str]], earlier: Iterable[str] = ()
) -> bool:
    """Whether a question with these recall `terms` asks about something the recent turns
    (`recent`, their messages as role and text) do not hold: fewer than half of its words
    are in them (a recent message that only asks holds nothing). Words said all the time (in
    more than a fifth of the `earlier` messages: a name a speaker signs with, the subject of
    the whole chat) tell nothing about where the answer is and are not counted.
    A question with no other content words ("and the other one?") is a follow-up."""
    words = {w for term in terms for w in _WORD.findall(term.lower())}
    said = [set(_WORD.findall(text.lower())) for text in earlier]
    if len(said) >= CONSTANT_AFTER:
        words = {w for w in words if sum(w in t for t in said) * 5 <= len(said)}
    if not words:
        return False
    seen: set[str] = set()
    for _, text in recent:
        if not only_a_question(text):  # it asks; what it names is not held there
            seen.update(_WORD.findall(text.lower()))
    found = sum(1 for w in words if w in seen or _stem_in(w, seen))
    return found < REACH_BACK_BELOW * len(words)


def only_a_question(text: str) -> bool:
    """Whether a message is one question and nothing else: it asks, it tells nothing (recall
    scores such a message at half, store/recall.py, by the same pattern)."""
    # `[^.!?]*\?\s*` in full, without a pattern: bench (i) scans every module pattern with
    # `finditer`, where this one restarts at each position.
    body = text.rstrip()
    return body.endswith("?") and not any(mark in body[:-1] for mark in ".!?")


def _stem_in(word: str, recent: set[str]) -> bool:
    """A word's plain inflections count as the word ("festival" in "festivals")."""
    if len(word) < 5:
        return False
    stem = word[:-1] if word.endswith("s") else word
    return any(r.startswith(stem[:5]) and abs(len(r) - len(stem)) <= 3 for r in recent)
