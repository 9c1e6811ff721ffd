"""How the demo model uses durable-memory hints (parley/consented.py): as a careful model would.

A hint is what the user said in an earlier conversation, unverified. It answers a question
nothing else answers ("how should you contact me?"), phrased as "last time" and checked with
the user; it never overrides a tool result: when a tool this turn speaks about the hint's
subject, the answer is the tool's, and the hint only earns a note that it is out of date.
"""

from __future__ import annotations

import re
from typing import Any

from parley.consented import CONTACT_CHANNEL

_CONTACT_QUESTION = re.compile(
    r"\bhow (?:should|do|will|would|can) (?:you|we) (?:usually )?(?:contact|reach) me\b",
    re.IGNORECASE,
)
_ORDER_KEY = re.compile(r"^order_(\d{3,10})(?:_|$)")


def contact_answer(user_text: str, hints: dict[str, str]) -> str | None:
    """The reply to "how should you contact me?", from the hint if there is one."""
    if not _CONTACT_QUESTION.search(user_text):
        return None
    channel = hints.get(CONTACT_CHANNEL)
    if channel is None:
        return "I don't have a saved preference for how to reach you. How would you like us to?"
    return (
        f"Last time you told us you preferred {channel} (a note from an earlier conversation, "
        "not verified). Is that still the best way to reach you?"
    )


def note_over_results(hints: dict[str, str], results: dict[str, dict[str, Any]]) -> str:
    """A note for each hint about an order that this turn's tool results also cover: the
    tool's answer stands, and the hint is only said to be older."""
    covered = {str(r.get("order_id")) for r in results.values() if isinstance(r, dict)}
    notes = []
    for key in sorted(hints):
        match = _ORDER_KEY.match(key)
        if match and match.group(1) in covered:
            notes.append(
                f"(I had an older note about order {match.group(1)} from an earlier "
                "conversation; the order system's answer above is the current one.)"
            )
    return " ".join(notes)
