"""The request body limit, enforced before anything reads a body: pure ASGI middleware.

It runs outside FastAPI, so before routing, authentication and JSON parsing. A declared
`Content-Length` over the limit is answered 413 at once, without reading a byte of the body
(the server then closes the connection rather than drain it). A body without a length
(chunked) is counted while the app reads it; at the first byte over the limit the client
gets the 413 and the app sees a disconnect, so no more than the limit is ever held.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.errors import error_body


class BodyLimit:
    def __init__(self, app: ASGIApp, *, max_bytes: int) -> None:
        self._app = app
        self._max = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self._max:
            await self._refuse(send)
            return
        await self._app(scope, *self._guarded(receive, send))

    def _guarded(self, receive: Receive, send: Send) -> tuple[Receive, Send]:
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
                if seen > self._max:
                    if not started:
                        answered = True
                        await self._refuse(send)
                    return {"type": "http.disconnect"}
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal started
            if answered:
                return
            started = True
            await send(message)

        return counting_receive, guarded_send

    async def _refuse(self, send: Send) -> None:
        body = json.dumps(
            error_body(
                "payload_too_large", f"the request body is over {self._max} bytes", limit=self._max
            )
        ).encode()
        headers: list[tuple[bytes, Any]] = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
        ]
        await send({"type": "http.response.start", "status": 413, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None  # the server refuses a malformed length before we see it
    return None
