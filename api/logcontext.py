"""Binds the ids a request is about to every line logged while it is served (`parley.logs`).

A plain ASGI middleware (not Starlette's `BaseHTTPMiddleware`, which runs the app in another
task), so the ids reach the route, its dependencies and a streamed response alike. The session
and turn come from the path; the tenant is added by `api.deps.current_identity` once the
token is known.
"""

from __future__ import annotations

import re

from starlette.types import ASGIApp, Receive, Scope, Send

from parley.logs import log_context

_SESSION_PATH = re.compile(r"^/v1/sessions/(?P<session>[^/]+)(?:/turns/(?P<turn>[^/]+))?")
_TENANT_PATH = re.compile(r"^/v1/admin/tenants/(?P<tenant>[^/]+)")


class RequestLogContext:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope.get("path", "")
        ids: dict[str, str | None] = {}
        if found := _SESSION_PATH.match(path):
            ids = {"session_id": found["session"], "turn_id": found["turn"]}
        elif found := _TENANT_PATH.match(path):
            ids = {"tenant_id": found["tenant"]}
        with log_context(**ids):
            await self.app(scope, receive, send)
