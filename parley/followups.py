"""Suggested next questions, from what this turn looked up. Deterministic and cheap: the
suggestions are offered, never required, so they must never hold up an answer."""

from __future__ import annotations

MAX_SUGGESTIONS = 3
MAX_CHARS = 60

_AFTER_TOOL = {
    "list_open_orders": ["What about the refund?", "Can you email me a summary?"],
    "get_order": ["Can I still return it?", "What about the refund?"],
    "get_refund": ["Can you email me a summary?", "When did it arrive?"],
    "check_return_eligibility": ["How do I return it?", "Can you email me the instructions?"],
    "propose_email": [],
    "handoff_to_human": [],
}


def suggest(tools_used: list[str], *, asked: str) -> list[str]:
    suggestions: list[str] = []
    for name in tools_used:
        for text in _AFTER_TOOL.get(name, []):
            if text not in suggestions and text.lower() != asked.strip().lower():
                suggestions.append(text)
    return [s[:MAX_CHARS] for s in suggestions[:MAX_SUGGESTIONS]]
