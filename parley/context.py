"""The context packer: what goes into the next prompt, decided by pure code.

For now the layers are the standing instructions (a stable prefix, friendly to prompt
caches) and the recent window of the conversation. Later layers (slots, summary, retrieved
knowledge, memory) plug in here with their priorities.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class WindowMessage:
    seq: int
    role: str
    text: str
    status: str


def pack_context(
    *, system_prompt: str, window: list[WindowMessage], max_messages: int
) -> list[dict[str, Any]]:
    """Return canonical messages: system first, then the newest `max_messages` in seq order.

    Retracted and empty assistant messages never reach the model; a cancelled or incomplete
    answer is kept but marked so the model does not take it as finished.
    """
    kept = [m for m in window if m.status != "retracted" and m.text]
    kept = sorted(kept, key=lambda m: m.seq)[-max_messages:]
    messages: list[dict[str, Any]] = [{"role": "system", "content": system_prompt}]
    for m in kept:
        content = m.text
        if m.role == "assistant" and m.status in ("incomplete", "cancelled"):
            content += f"\n[this answer was {m.status}]"
        messages.append({"role": m.role, "content": content})
    return messages
