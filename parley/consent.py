"""Mapping a typed reply to the single pending action: server code, never the model.

Only short, unambiguous replies count. "Yes, but change the subject" is not consent to the
email as shown, so anything longer is an ordinary message (which supersedes the action).
"""

from __future__ import annotations

import re

from parley.statuses import Decision

_YES = re.compile(
    r"^\s*(yes|yes please|yes,? send it|send it|confirm|confirmed|go ahead|ok,? send it)"
    r"\s*[.!]*\s*$",
    re.IGNORECASE,
)
_NO = re.compile(
    r"^\s*(no|no thanks|no,? thank you|don'?t send it|do not send it|cancel)\s*[.!]*\s*$",
    re.IGNORECASE,
)


def typed_decision(text: str) -> Decision | None:
    """'confirmed', 'declined', or None when the text is not a plain yes or no."""
    if _YES.match(text):
        return Decision.confirmed
    if _NO.match(text):
        return Decision.declined
    return None
