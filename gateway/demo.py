"""The built-in deterministic `demo` model.

It needs no network and answers the same request with the same words every time, streamed
token by token with a configurable delay, so tests and the one-command demo can rely on
every word. It counts the tokens it produces so tests can see when generation stops.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator

from gateway.base import Finish, ModelRequest, StreamEvent, TextDelta

_TOKEN = re.compile(r"\S+\s*|\s+")


def _last_user_text(request: ModelRequest) -> str:
    for message in reversed(request.messages):
        if message["role"] == "user":
            return str(message["content"])
    return ""


def compose_reply(request: ModelRequest) -> str:
    asked = " ".join(_last_user_text(request).split())
    if len(asked) > 200:
        asked = asked[:197] + "..."
    earlier = sum(1 for m in request.messages if m["role"] in ("user", "assistant")) - 1
    return (
        f'You wrote: "{asked}". I am the Parley demo model, so I answer the same words every '
        "time and look nothing up. "
        f"I can see {earlier} earlier message{'s' if earlier != 1 else ''} in this conversation. "
        "Connect a real model provider to get real answers."
    )


def tokenize(text: str) -> list[str]:
    return _TOKEN.findall(text)


class DemoModel:
    name = "demo"

    def __init__(self, *, token_delay_s: float = 0.015) -> None:
        self.token_delay_s = token_delay_s
        self.tokens_emitted = 0

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
        tokens = tokenize(compose_reply(request))
        for token in tokens:
            if self.token_delay_s:
                await asyncio.sleep(self.token_delay_s)
            self.tokens_emitted += 1
            yield TextDelta(token)
        yield Finish("stop", {"input_tokens": _count_input(request), "output_tokens": len(tokens)})


def _count_input(request: ModelRequest) -> int:
    return sum(len(tokenize(str(m["content"]))) for m in request.messages)
