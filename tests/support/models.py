"""Model providers for tests: real `ModelProvider`s whose behaviour a test controls: the demo
model steered (`ControlledModel`), and a model that answers from a script (`ScriptedModel`)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from temporalio.exceptions import ApplicationError

from parley.context import unfence
from parley.gateway.base import Finish, ModelRequest, StreamEvent, TextDelta, ToolCallRequest
from parley.gateway.demo import DemoModel, tokenize


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
        # Set: the next answer stops after this many tokens until `resume` is set, with
        # `held` set meanwhile (something happens to the world mid-answer, whatever the load).
        self.hold_after: int | None = None
        self.held = asyncio.Event()
        self.resume = asyncio.Event()

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
        if self.first_token_gate is not None:
            self.waiting.set()
            await self.first_token_gate.wait()
        fixed = self.reply(request)
        fail_at = self.fail_after(request)
        if fixed is None and fail_at is None:
            produced = 0
            async for event in super().stream(request):
                if isinstance(event, TextDelta) and produced == self.hold_after:
                    self.held.set()
                    await self.resume.wait()
                produced += isinstance(event, TextDelta)
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


# --- a scripted model ---------------------------------------------------------------------

Reply = list[ToolCallRequest] | str
Script = Callable[[ModelRequest, int], Reply]


def round_of(request: ModelRequest) -> int:
    """Which model call of the turn this is: the number of tool-calling rounds after the
    turn's user message (0 for the first call)."""
    messages = request.messages
    last_user = max((i for i, m in enumerate(messages) if m["role"] == "user"), default=-1)
    return sum(
        1 for m in messages[last_user + 1 :] if m["role"] == "assistant" and m.get("tool_calls")
    )


def tool_results(request: ModelRequest) -> dict[str, dict[str, Any]]:
    """The tool results the model can read in this request, by provider call id."""
    return {
        str(m["tool_call_id"]): json.loads(unfence(m["content"]))["result"]
        for m in request.messages
        if m["role"] == "tool"
    }


def rounds(*calls: list[ToolCallRequest], text: str = "Done.") -> Script:
    """A script: the n-th model call of a turn returns calls[n], later calls answer `text`."""

    def script(_: ModelRequest, n: int) -> Reply:
        return calls[n] if n < len(calls) else text

    return script


def call(call_id: str, name: str, arguments: str | dict[str, Any]) -> ToolCallRequest:
    text = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return ToolCallRequest(call_id, name, text)


@dataclass
class ScriptedModel:
    """A `ModelProvider` that answers from a script and records every request it gets."""

    name: str = "scripted"
    script: Script = field(default_factory=lambda: rounds())
    requests: list[ModelRequest] = field(default_factory=list)
    # A slow provider: this long before each word of a text answer.
    token_delay_s: float = 0.0
    # Words of text answers actually produced (to see a stream stop).
    words_emitted: int = 0

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
        self.requests.append(request)
        answer = self.script(request, round_of(request))
        if isinstance(answer, str):
            words = answer.split(" ")
            for i, word in enumerate(words):
                if self.token_delay_s:
                    await asyncio.sleep(self.token_delay_s)
                self.words_emitted += 1
                yield TextDelta(word if i == len(words) - 1 else word + " ")
            yield Finish("stop", {"output_tokens": len(answer.split())})
            return
        for tool_call in answer:
            yield tool_call
        yield Finish("tool_calls", {"output_tokens": 10 * len(answer)})

    def start(self, script: Script) -> None:
        self.script = script
        self.requests.clear()
