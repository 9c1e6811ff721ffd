"""The response every live stream answers with: sse-starlette's, with each write bounded,
the bookkeeping run once however it ended, open streams counted, and a database outage
ending the stream with a `retry:` frame instead of breaking it off (api/streaming.py)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterable, AsyncIterator, Callable
from typing import Any

from sse_starlette import EventSourceResponse, ServerSentEvent
from sse_starlette.sse import SendTimeoutError
from starlette.types import Message, Receive, Scope, Send

from parley.api.metrics import STREAMS_OPEN
from parley.config import Settings
from parley.store.db import StoreError, is_unreachable

log = logging.getLogger(__name__)

# The reconnect pause a stream cut by a database outage asks for (SSE `retry:`).
OUTAGE_RETRY_MS = 2000


class TurnEventResponse(EventSourceResponse):
    """sse-starlette's response, each write bounded by asyncio's own timeout: its anyio
    cancel scope (with the async library looked up each time) cost more than the write
    itself, once per frame batch of every stream.

    `on_close` runs once, when the response is done, however it ended: the place for a
    stream's bookkeeping (its slot, its viewer). Not the generator's `finally`, which never
    runs for a generator that never started (the headers could not be sent, the client was
    gone first), and which may run only when the generator is collected."""

    def __init__(self, *args: Any, on_close: Callable[[], None] | None = None, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.body_iterator = _until_outage(self.body_iterator)
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            if self._on_close is not None:
                self._on_close()

    async def _send_with_timeout(self, send: Send, message: Message) -> None:
        bound = asyncio.timeout(self.send_timeout)
        try:
            async with bound:
                await send(message)
        except TimeoutError:
            if bound.expired():
                raise SendTimeoutError() from None
            raise


# What every live stream answers with: never cached, never buffered by a proxy in front.
NO_STORE = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}


def live_response(
    frames: AsyncGenerator[Any, None],
    settings: Settings,
    *,
    on_close: Callable[[], None] | None = None,
    headers: dict[str, str] = NO_STORE,
) -> TurnEventResponse:
    """A live stream's response: counted among the open streams while its frames run, kept
    alive and each write bounded as the settings say, `on_close` run once when it is done."""
    return TurnEventResponse(
        _counted(frames),
        on_close=on_close,
        ping=settings.stream_keepalive_s,
        send_timeout=settings.stream_send_timeout_s,
        headers=headers,
    )


async def _counted(frames: AsyncGenerator[Any, None]) -> AsyncIterator[Any]:
    STREAMS_OPEN.inc()
    try:
        async with contextlib.aclosing(frames):  # its own `finally` runs now, not when collected
            async for frame in frames:
                yield frame
    finally:
        STREAMS_OPEN.dec()


async def _until_outage(frames: AsyncIterable[Any]) -> AsyncIterator[Any]:
    """The stream's frames until the database is found gone; then a last frame that asks the
    client to come back (`retry:`), and a clean end rather than a broken one. Closing it
    closes `frames` (their `finally` runs now, not when they are collected)."""
    try:
        async for frame in frames:
            yield frame
    except StoreError as exc:
        if not is_unreachable(exc):
            raise
        log.warning("the database is unreachable; the stream asks its client to reconnect")
        yield ServerSentEvent(
            comment="the database is unreachable; reconnect", retry=OUTAGE_RETRY_MS
        ).encode()
    finally:
        close = getattr(frames, "aclose", None)
        if close is not None:
            await close()
