"""The demo model's policy answers: read from the knowledge passages in its prompt, never
invented.

A policy question ("What is your policy on damaged items?") is answered by quoting the
sentences of the best-matching passage that share words with the question (or its opening
sentences), naming the document and section and citing the passage's reference (`[K1]`), as
the prompt asks a real model to. With no matching passage it says it cannot find the answer
in the documents. Questions about the customer's own orders are not policy questions: those
go to tools (gateway/demo.py).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from parley.knowledge import ShownPassage, query_terms

_POLICY = re.compile(
    r"\b(polic(?:y|ies)|warrant(?:y|ies)|damaged?|broken|defect\w*|faulty|business accounts?|"
    r"invoic\w*|volume pricing|international|shipping (?:costs?|fees?|times?|options?)|"
    r"return window|how long do refunds?|lost parcels?)\b",
    re.IGNORECASE,
)
_SENTENCE = re.compile(r"(?<=[.!?])\s+")
NOT_FOUND = (
    "I couldn't find that in our policy documents, so I can't answer it reliably. I can pass "
    "your question to a person from our support team."
)


def is_policy_question(text: str) -> bool:
    return bool(_POLICY.search(text))


def _stem(word: str) -> str:
    return word[:5]  # crude, enough for "damaged"/"damage", "returns"/"returned"


def _overlap(terms: set[str], text: str) -> int:
    return len(terms & {_stem(t) for t in query_terms(text)})


def policy_answer(question: str, passages: Sequence[ShownPassage]) -> str | None:
    """The answer to a policy question from `passages`; None when it is not one."""
    if not is_policy_question(question):
        return None
    terms = {_stem(t) for t in query_terms(question)} - {"polic", "your", "about"}
    scored = [
        (_overlap(terms, f"{p.section} {p.title} {p.text}"), -i, p) for i, p in enumerate(passages)
    ]
    scored = [s for s in scored if s[0] > 0]
    if not scored:
        return NOT_FOUND
    _, _, best = max(scored, key=lambda s: (s[0], s[1]))
    sentences = _SENTENCE.split(" ".join(best.text.split()))
    matching = [s for s in sentences if _overlap(terms, s) > 0][:3] or sentences[:2]
    quoted = " ".join(matching)
    return f'From our {best.title} policy, "{best.section}": {quoted} [{best.ref}]'
