"""Hybrid recall, as a pure rule: reciprocal rank fusion of several rankings of messages.

Full-text search finds the messages that share the question's words; an embedding model finds
the ones that say the same thing in other words ("what is her identity?" and "I'm a
transgender woman"). Neither score means anything to the other, so they are fused by rank
alone: a message scores the sum of `1 / (k + rank)` over the rankings it appears in (rank
from 1), and a message found by both outranks one found by either alone at the same rank.
A small `k` lets the top of each ranking count for more; 10 was the best of 10, 20 and 60 on
the LoCoMo bench (bench/memory.py).
"""

from __future__ import annotations

import re
from bisect import bisect_left
from collections.abc import Hashable, Iterable, Sequence
from functools import lru_cache
from typing import TypeVar

FUSION_K = 10
# How many candidates each ranking contributes to the fusion.
CANDIDATES = 100
# The best hits whose adjacent messages are offered as a ranking of their own.
NEIGHBOUR_TOP = 10
# What a round of neighbours counts for in the fusion, against 1 for a search's ranking. At 1,
# three rounds of neighbours of the ten best hits outranked every line only one search found,
# and lines of a second or third exchange that answer the same question (several evidence
# lines in different sessions) lost their room to them; at 0.4 a neighbour of several good
# hits still climbs (LoCoMo imported, bench/locomo_replay.py: with the reach-back share of
# 0.85, 78.3% to 79.4%).
NEIGHBOUR_WEIGHT = 0.4

T = TypeVar("T", bound=Hashable)


def fuse(
    rankings: Sequence[Sequence[T]],
    *,
    k: int = FUSION_K,
    weights: Sequence[float] = (),
) -> list[T]:
    """The items of every ranking (best first), ordered by their fused score, best first;
    ties keep the order in which the items were first seen. A ranking counts `weights[i]`
    times (1 for those past the weights given)."""
    if k < 1:
        raise ValueError("k must be at least 1")
    scores: dict[T, float] = {}
    for i, ranking in enumerate(rankings):
        weight = weights[i] if i < len(weights) else 1.0
        seen: set[T] = set()
        for rank, item in enumerate(ranking, start=1):
            if item in seen:  # a ranking counts each item once, at its best rank
                continue
            seen.add(item)
            scores[item] = scores.get(item, 0.0) + weight / (k + rank)
    first = {item: i for i, item in enumerate(scores)}
    return sorted(scores, key=lambda item: (-scores[item], first[item]))


def neighbours(
    ranking: Sequence[int], *, top: int = NEIGHBOUR_TOP, order: Sequence[int] = ()
) -> list[int]:
    """The messages next to the `top` best hits (the one before, then the one after), in the
    order of their hits: the question an answer replies to, the answer a question got. Next
    in `order` (the seqs recall may show, ascending: canned and repeated texts left out, so a
    neighbour is the nearest message that says something), or next by seq without one. Fused
    as one more ranking, a neighbour of several good hits climbs; of one weak hit, it stays
    low. On the LoCoMo bench this found evidence turns that share no word and little meaning
    with the question (bench/memory.py)."""
    found: dict[int, None] = {}
    for seq in ranking[:top]:
        for near in _beside(seq, order):
            if near > 0:
                found[near] = None
    return list(found)


def _beside(seq: int, order: Sequence[int]) -> tuple[int, ...]:
    """The seqs before and after `seq`: in `order` when there is one, else by one."""
    if not order:
        return (seq - 1, seq + 1)
    at = bisect_left(order, seq)
    after = at + 1 if at < len(order) and order[at] == seq else at
    return tuple(order[i] for i in (at - 1, after) if 0 <= i < len(order))


def rounds_for(budget: int) -> int:
    """How many rounds of neighbours recall takes for a recall budget of `budget` tokens:
    two at the floor's 200 (the most LoCoMo evidence turns there; bench/memory.py), one more
    for each further 1,000 tokens, at most four: room for whole exchanges, not more lines
    of the same one."""
    return max(1, min(4, 2 + budget // 1000))


def with_neighbours(
    rankings: Sequence[Sequence[int]],
    *,
    below: int,
    top: int = NEIGHBOUR_TOP,
    rounds: int = 2,
    order: Sequence[int] = (),
) -> list[int]:
    """The rankings fused with the neighbours (seqs under `below`, next in `order`) of their
    best hits, found `rounds` times, each round a ranking of its own: a neighbour the first
    round lifted into the top lends its own neighbours to the next, so a three-message
    exchange around one good hit can come in whole. Each round counts `NEIGHBOUR_WEIGHT` of
    a search's ranking. With an `order`, what is not in it (a repeated text) is no candidate
    either."""
    if order:
        allowed = set(order)
        rankings = [[s for s in r if s in allowed] for r in rankings]
    extra: list[list[int]] = []
    weights = [1.0] * len(rankings) + [NEIGHBOUR_WEIGHT] * rounds
    for _ in range(rounds):
        near = neighbours(fuse([*rankings, *extra], weights=weights), top=top, order=order)
        extra.append([s for s in near if s < below])
    return fuse([*rankings, *extra], weights=weights)


# --- compact recalled lines ---------------------------------------------------------------------

# Words that carry no fact on their own: a sentence made only of these (and punctuation) is a
# greeting, a thank-you or an exclamation, and a recalled line can do without it. Yes and no
# are not among them: an answer's "No." is a fact about what was asked.
_FILLER = frozenset(
    "hey hi hello hiya yo oh wow whoa yay ok okay sure cool great awesome "
    "amazing wonderful fantastic lovely nice good glad happy so very really totally that's "
    "thats that is it's its what a an the to you your too see hear thanks thank much lot "
    "appreciate appreciated it bye later take care talk soon catch up again how are have been "
    "doing going i'm im me my congrats congratulations haha lol sounds well true right agreed "
    "absolutely definitely exactly for sharing hearing telling love all".split()
)
_SENTENCE = re.compile(r"[^.!?…]+[.!?…]*\s*")
_WORD = re.compile(r"[A-Za-z0-9']+")
_LABEL = re.compile(r"^[A-Z][\w'-]{0,30}: ")


# Texts up to this long keep their trimmed form: recall shows the same older messages turn
# after turn, and a worker serves many sessions at once.
TRIMMED_CHARS = 4_000


# A role's speaker is named once in a recall block's heading from this many lines of it on.
SPEAKER_LINES = 3


def speakers(lines: Iterable[tuple[str, str]]) -> dict[str, str]:
    """The speaker each role's lines all start with ("Caroline: ..."), by role, for the roles
    with at least three such `lines` (role and text) and no line without the same label: a
    transcript brought in from elsewhere names its speakers in every line, and a recall
    block can then name them once in its heading instead of in each line (on the LoCoMo
    replay, a few more lines in the same budget; bench/locomo_replay.py)."""
    found: dict[str, set[str]] = {}
    counts: dict[str, int] = {}
    for role, text in lines:
        label = _LABEL.match(text)
        found.setdefault(role, set()).add(label.group(0)[:-2] if label else "")
        counts[role] = counts.get(role, 0) + 1
    return {
        role: next(iter(names))
        for role, names in found.items()
        if len(names) == 1 and "" not in names and counts[role] >= SPEAKER_LINES
    }


def unlabelled(text: str, speaker: str | None) -> str:
    """The text without its leading `speaker` label ("Caroline: "), when it has one."""
    if speaker and text.startswith(speaker + ": "):
        return text[len(speaker) + 2 :]
    return text


def said(text: str) -> str:
    """What a message says, as recall by meaning embeds it: without a transcript's speaker
    label ("Caroline: ") and its filler sentences. A label in every line pulls each speaker's
    lines together, and towards any question that names them, whatever they are about;
    greetings pull every opening line towards every other (on the LoCoMo replay, with
    `without_speakers` for the question, 79.5% to 82.8%; bench/locomo_replay.py)."""
    label = _LABEL.match(text)
    return trim_filler(text[label.end() :] if label else text) or text


def without_speakers(question: str, speakers: Iterable[str]) -> str:
    """The question without the names of the session's `speakers` (and their possessive):
    what it asks about, for recall by meaning, which compares it with lines embedded without
    their labels (`said`). Unchanged when nothing else would be left."""
    names = [re.escape(name) for name in speakers if name]
    if not names:
        return question
    pattern = re.compile(r"\b(?:" + "|".join(names) + r")(?:['’]s)?\b")
    stripped = " ".join(pattern.sub(" ", question).split())
    return stripped if _WORD.search(stripped) else question


def trim_filler(text: str) -> str:
    """The text without its filler sentences (greetings, thanks, bare exclamations), in the
    speaker's own words otherwise; unchanged when nothing else would be left."""
    if len(text) <= TRIMMED_CHARS:
        return _trimmed(text)
    return _trim(text)


@lru_cache(maxsize=4096)
def _trimmed(text: str) -> str:
    return _trim(text)


def _trim(text: str) -> str:
    label = _LABEL.match(text)  # "Name: ..." keeps who is speaking
    head, body = (label.group(0), text[label.end() :]) if label else ("", text)
    sentences = _SENTENCE.findall(body)
    kept = [s for s in sentences if not _is_filler(s)]
    if not kept or len(kept) == len(sentences):
        return text
    return head + "".join(kept).strip()


def _is_filler(sentence: str) -> bool:
    words = [w.lower() for w in _WORD.findall(sentence)]
    # A name after a greeting ("Hey Mel!") is still a greeting: one capitalised word may pass,
    # beside filler (alone, "Tuesday." or "No." answers something).
    names = [w for w in _WORD.findall(sentence) if w[:1].isupper() and w.lower() not in _FILLER]
    return (
        any(w in _FILLER for w in words)
        and len(names) <= 1
        and all(w in _FILLER or w in {n.lower() for n in names} for w in words)
    )
