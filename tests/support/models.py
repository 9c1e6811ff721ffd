"""Model providers for tests: real `ModelProvider`s whose behaviour a test controls."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

from temporalio.exceptions import ApplicationError

from gateway.base import Finish, ModelRequest, StreamEvent, TextDelta
from gateway.demo import DemoModel, tokenize


class ControlledModel(DemoModel):
    """The demo model, plus what a test needs: a fixed reply, a failure after N tokens, and
    a counter of tokens actually produced (to see generation stop)."""

    def __init__(self, *, token_delay_s: float = 0.02) -> None:
        super().__init__(token_delay_s=token_delay_s)
        self.reply: Callable[[ModelRequest], str | None] = lambda request: None
        self.fail_after: Callable[[ModelRequest], int | None] = lambda request: None
        # Set: the model says nothing until it is (a provider still thinking).
        self.first_token_gate: asyncio.Event | None = None
        self.waiting = asyncio.Event()  # set once a stream waits at the gate

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
        if self.first_token_gate is not None:
            self.waiting.set()
            await self.first_token_gate.wait()
        fixed = self.reply(request)
        fail_at = self.fail_after(request)
        if fixed is None and fail_at is None:
            async for event in super().stream(request):
                yield event
            return
        self.calls += 1
        if fixed is None:
            text = "".join(
                [
                    e.text
                    async for e in DemoModel(token_delay_s=0).stream(request)
                    if isinstance(e, TextDelta)
                ]
            )
        else:
            text = fixed
        tokens = tokenize(text)
        for n, token in enumerate(tokens):
            if fail_at is not None and n == fail_at:
                # What a provider's 4xx-class failure looks like to the activity.
                raise ApplicationError(
                    "the provider failed mid-stream", type="provider_error", non_retryable=True
                )
            if self.token_delay_s:
                await asyncio.sleep(self.token_delay_s)
            self.tokens_emitted += 1
            yield TextDelta(token)
        yield Finish("stop", {"input_tokens": 1, "output_tokens": len(tokens)})
