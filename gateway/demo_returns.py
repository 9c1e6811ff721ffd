"""The demo model's part in returns: a request to return something from an order is handed
to the Returns specialist (`delegate_returns`) when that tool is offered.

The specialist's own steps (which item, why, the window, the proposal) are fixed by code
(workflows/specialist.py), so the demo has nothing more to decide. A failed hand-over (an
order that is not the customer's, or has nothing to return) is worded from the tool result.
"""

from __future__ import annotations

import re
from typing import Any

from parley.gateway.demo_orders import Step
from parley.specialists import DELEGATE_RETURNS

_RETURN_FROM = re.compile(
    r"\breturn\b.*\b(?:something|an? item|items?|one|part)\b.*\border\s*#?\s*(\d{3,10})\b", re.I
)


def next_step(tools: list[dict[str, Any]], user_text: str, results: dict[str, Any]) -> Step | None:
    """The demo's move for a return to hand over; None leaves the turn to the rest."""
    result = results.get(DELEGATE_RETURNS)
    if result is not None:
        error = (result.get("error") or {}).get("code")
        if error == "not_found":
            return Step("I couldn't find that order on your account.")
        return Step("I couldn't hand this to our Returns specialist just now.")
    if results:
        return None
    asked = _RETURN_FROM.search(user_text)
    offered = any(t.get("name") == DELEGATE_RETURNS for t in tools)
    if asked is None or not offered:
        return None
    return Step(tool=DELEGATE_RETURNS, arguments={"order_id": asked.group(1)})
