"""The demo model's part for tools from outside (a tenant's MCP servers, namespaced
`<server>__<tool>`).

It behaves like a careful model: it asks for the store hours only through a
`…__get_store_hours` tool it is offered, answers with exactly what the result says, and
when no such tool is offered or the call failed it says it cannot look the hours up right
now; it never states hours of its own. A reservation goes through the offered write tool,
which the server turns into a proposal; the demo then words what the user decided.
"""

from __future__ import annotations

import re
from typing import Any

from parley.gateway.demo_orders import Step
from parley.mcp import SEPARATOR

_HOURS = re.compile(r"\b(hours|opening times?|when (are|is) (you|the store) open)\b", re.I)
_RESERVE = re.compile(r"\b(reserve|hold)\b.*\bpick ?up\b|\bpick ?up\b.*\b(reserve|hold)\b", re.I)
_CITY = re.compile(r"\b(?:in|at)\s+([A-Z][a-z]+(?:\s[A-Z][a-z]+)?)")
_PRODUCT = re.compile(r"\b[A-Z]{2}-[A-Z]{3}-\d{3}\b")

CANNOT_LOOK_UP = (
    "I can't look up our store hours right now, so I won't guess them. Please try again in a "
    "little while, or check the store page."
)


def next_step(
    tools: list[dict[str, Any]], state: dict[str, Any], user_text: str, results: dict[str, Any]
) -> Step | None:
    """The demo's move when an MCP tool is in play; None leaves the turn to the rest."""
    action = state.get("action")
    if action and SEPARATOR in str(action.get("tool")) and action.get("status") != "pending":
        return Step(_about_action(action))
    outside = {name: r for name, r in results.items() if SEPARATOR in name}
    if outside:
        return Step(" ".join(_about_result(name, r) for name, r in outside.items()))
    if results:
        return None
    offered = [str(t.get("name")) for t in tools]
    if _HOURS.search(user_text):
        city = _CITY.search(user_text)
        tool = next((n for n in offered if n.endswith(f"{SEPARATOR}get_store_hours")), None)
        if tool is None:
            return Step(CANNOT_LOOK_UP)
        if city is None:
            return Step("Which city's store would you like the hours for?")
        return Step(tool=tool, arguments={"city": city.group(1)})
    if _RESERVE.search(user_text):
        tool = next((n for n in offered if n.endswith(f"{SEPARATOR}reserve_in_store_pickup")), None)
        product, city = _PRODUCT.search(user_text), _CITY.search(user_text)
        if tool is None:
            return Step("I can't make store reservations right now.")
        if product is None or city is None:
            return Step("Which product (its code, like NW-TNT-301) and which store city?")
        return Step(tool=tool, arguments={"product_id": product.group(0), "city": city.group(1)})
    return None


def _about_result(name: str, result: dict[str, Any]) -> str:
    if "error" in result:
        if name.endswith("get_store_hours"):
            return CANNOT_LOOK_UP
        return "I couldn't get that done just now; nothing was changed."
    if result.get("status") == "pending_confirmation":
        return (
            f"I've prepared this for you: {result.get('summary')}. Nothing happens until you "
            "confirm."
        )
    content = result.get("content")
    if name.endswith("get_store_hours") and isinstance(content, dict):
        if not content.get("found"):
            cities = ", ".join(content.get("cities") or [])
            return f"We don't have a store in {content.get('city')}. Our stores: {cities}."
        days = ", ".join(f"{h['days']} {h['open']}-{h['close']}" for h in content["hours"])
        return f"Our {content['city']} store is open {days}."
    return "Here is what I found: " + str(content)[:500]


def _about_action(action: dict[str, Any]) -> str:
    status = action.get("status")
    if status == "executed":
        result = (action.get("outcome") or {}).get("result") or {}
        ref = result.get("reservation_id") if isinstance(result, dict) else None
        return f"Done: {action.get('summary')}." + (f" Your reference is {ref}." if ref else "")
    if status == "expired":
        return "The confirmation expired, so I didn't do it."
    if status in ("failed", "unknown"):
        return "That didn't go through, and I couldn't confirm it was done."
    return "OK, I won't do that."
