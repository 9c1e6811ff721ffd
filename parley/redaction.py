"""Model-facing redaction: what a tenant that asks for it (`TenantConfig.redact_model_input`)
sends a provider instead of card numbers and email addresses.

The patterns are the log filter's (`parley/logs.py` `redact`), so one definition decides what
a card number or an address is, for logs and for prompts alike. Only what leaves for the
provider is masked: the stored messages keep the user's words, and a tool that needs the real
value (the order system, the confirmed send) reads it from the store, never from the prompt.
"""

from __future__ import annotations

from typing import Any

from parley.logs import redact


def redact_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Canonical prompt messages with every card number and email address in their content
    and in the arguments of their tool calls masked (`[card]`, `[email]`)."""
    out = []
    for message in messages:
        masked = dict(message)
        if "content" in masked:
            masked["content"] = _masked(masked["content"])
        if masked.get("tool_calls"):
            masked["tool_calls"] = [
                {**call, "arguments": _masked(call.get("arguments"))}
                for call in masked["tool_calls"]
            ]
        out.append(masked)
    return out


def _masked(value: Any) -> Any:
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, list):
        return [_masked(item) for item in value]
    if isinstance(value, dict):
        return {key: _masked(item) for key, item in value.items()}
    return value
