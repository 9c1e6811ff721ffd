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

from collections.abc import Hashable, Sequence
from typing import TypeVar

FUSION_K = 10
# How many candidates each ranking contributes to the fusion.
CANDIDATES = 100

T = TypeVar("T", bound=Hashable)


def fuse(rankings: Sequence[Sequence[T]], *, k: int = FUSION_K) -> list[T]:
    """The items of every ranking (best first), ordered by their fused score, best first;
    ties keep the order in which the items were first seen."""
    if k < 1:
        raise ValueError("k must be at least 1")
    scores: dict[T, float] = {}
    for ranking in rankings:
        seen: set[T] = set()
        for rank, item in enumerate(ranking, start=1):
            if item in seen:  # a ranking counts each item once, at its best rank
                continue
            seen.add(item)
            scores[item] = scores.get(item, 0.0) + 1.0 / (k + rank)
    first = {item: i for i, item in enumerate(scores)}
    return sorted(scores, key=lambda item: (-scores[item], first[item]))
