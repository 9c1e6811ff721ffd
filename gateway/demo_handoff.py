"""The demo model's case summary for a hand-off (parley/handoffs.py): copied from the request,
never invented. It names what the customer wants (their last question before the hand-off),
the order in play, what they asked before and what was already run."""

from __future__ import annotations

import json
from typing import Any


def case_summary(body: dict[str, Any]) -> str:
    asked = [m["text"] for m in body.get("conversation", []) if m.get("role") == "user"]
    order = body.get("order_in_play")
    parts = [f"The customer asked for a person: {body.get('reason') or 'no reason given'}."]
    if order:
        parts.append(f"Order {order} is in play.")
    if len(asked) > 1:
        parts.append("Earlier they asked: " + " / ".join(f'"{t}"' for t in asked[-4:-1]) + ".")
    tools = list(dict.fromkeys(body.get("tools_run") or []))
    if tools:
        parts.append("Already looked up: " + ", ".join(tools) + ".")
    return json.dumps({"summary": " ".join(parts)})
