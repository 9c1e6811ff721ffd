"""The request body limit, enforced before anything reads a body: pure ASGI middleware.

It runs outside FastAPI, so before routing, authentication and JSON parsing. A declared
`Content-Length` over the limit is answered 413 at once, without reading the body. A body
without a length (chunked) is counted while the app reads it; at the first byte over the
limit the client gets the 413 and the app sees a disconnect, so no more than the limit is
ever held. A body framed by its length (or a request without a body) needs no counting: the
server never reads past the declared length, so those requests pass through unwrapped.

After a 413 the connection closes. Closed with the client's bytes still unread, it would be
reset, and a reset can discard the answer before the client has read it. So the answer is
sent whole, then what the client keeps sending is read and dropped for a moment (at most
`LINGER_S` and `LINGER_BYTES`), and only then is the response completed and the connection
closed: the bytes held at any time stay within one read.

A few routes take larger bodies (a file upload): `larger` maps a path pattern to its own
limit, decided the same way, before anything is read.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import Mapping
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from parley.api.errors import error_body

# After a 413: how long, and how much of the rest of the body, is read and dropped before the
# close, so the client can read the answer first.
LINGER_S = 1.0
LINGER_BYTES = 4 * 1024 * 1024


class BodyLimit:
    def __init__(
        self, app: ASGIApp, *, max_bytes: int, larger: Mapping[str, int] | None = None
    ) -> None:
        self._app = app
        self._max = max_bytes
        self._larger = [(re.compile(p), limit) for p, limit in (larger or {}).items()]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        limit = self._limit_for(scope.get("path", ""))
        declared, chunked = _framing(scope)
        if declared is not None and declared > limit:
            await self._refuse(send, limit)
            await _linger(receive, send)
            return
        if not chunked:
            # The server reads no more than the declared length, and without one (nor a
            # transfer coding) there is no body: nothing to count, so no wrapper around
            # every receive and send (an event stream's sends are many).
            await self._app(scope, receive, send)
            return
        await self._app(scope, *self._guarded(receive, send, limit))

    def _limit_for(self, path: str) -> int:
        for pattern, limit in self._larger:
            if pattern.fullmatch(path):
                return limit
        return self._max

    def _guarded(self, receive: Receive, send: Send, limit: int) -> tuple[Receive, Send]:
        """`receive` that counts the body and `send` that goes quiet once 413 is sent."""
        seen = 0
        answered = False  # by us (413): the app's own answer is dropped
        started = False  # the app's answer has begun: too late for a 413

        async def counting_receive() -> Message:
            nonlocal seen, answered
            if answered:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    if not started:
                        answered = True
                        await self._refuse(send, limit)
                        await _linger(receive, send)
                    return {"type": "http.disconnect"}
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal started
            if answered:
                return
            started = True
            await send(message)

        return counting_receive, guarded_send

    async def _refuse(self, send: Send, limit: int) -> None:
        body = json.dumps(
            error_body("payload_too_large", f"the request body is over {limit} bytes", limit=limit)
        ).encode()
        headers: list[tuple[bytes, Any]] = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
        ]
        await send({"type": "http.response.start", "status": 413, "headers": headers})
        # All of it, but not yet complete: `_linger` completes it.
        await send({"type": "http.response.body", "body": body, "more_body": True})


async def _linger(receive: Receive, send: Send) -> None:
    """Read and drop what the client still sends, briefly and boundedly, then complete the
    response (the server closes the connection after it)."""
    dropped = 0
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(LINGER_S):
            while dropped < LINGER_BYTES:
                message = await receive()
                if message["type"] != "http.request" or not message.get("more_body"):
                    break
                dropped += len(message.get("body", b""))
    await send({"type": "http.response.body", "body": b""})


def _framing(scope: Scope) -> tuple[int | None, bool]:
    """The declared `Content-Length`, and whether the body has a transfer coding (chunked),
    which overrides any declared length (RFC 9112 6.3): then only counting bounds it."""
    declared, chunked = None, False
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                declared = int(value)
            except ValueError:
                pass  # the server refuses a malformed length before we see it
        elif name == b"transfer-encoding":
            chunked = True
    return declared, chunked
