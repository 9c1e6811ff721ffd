"""Cross-origin requests from a tenant's own frontend (CORS), per tenant: pure ASGI middleware.

A tenant lists the origins of its web apps (`TenantConfig.cors_origins`); nothing is allowed
by default. A browser asks before a cross-origin call with a token (a preflight: `OPTIONS`
with `Access-Control-Request-Method`), and a preflight carries no token, so it cannot say
which tenant it is for: a preflight from an origin that any tenant lists is answered with the
allow headers (methods, `Authorization`, `Content-Type`, `Last-Event-ID`); from any other
origin it gets none (the route's own answer, a 405). The preflight grants nothing by itself:
the request that follows still needs its token, and its answer carries
`Access-Control-Allow-Origin` only when the origin is on the list of the tenant the token
signed in to (api/deps.py names it), so a page of tenant A's domain cannot read what a token
of tenant B gets. An answer that names no tenant (a 401, a public route) is readable by any
listed origin: it holds nothing of a tenant's.

The lists are read from the tenants' configs, at most every `REFRESH_S` seconds per API
process; `PUT .../config` refreshes its own process's at once. Credentials mode (cookies)
is never allowed: Parley's callers send a bearer token.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from parley.store import tenants
from parley.store.db import Database, StoreError

log = logging.getLogger(__name__)

REFRESH_S = 5.0
METHODS = "GET, POST, PUT, PATCH, DELETE"
# What a client sends: its token, a JSON body, and the event id a stream resumes after.
REQUEST_HEADERS = "Authorization, Content-Type, Last-Event-ID"
# What a client reads besides the body: when to try again, why a token was refused, an
# export archive's file name.
EXPOSED_HEADERS = "Retry-After, WWW-Authenticate, Content-Disposition"
MAX_AGE_S = 600


class AllowedOrigins:
    """The tenants' origin lists, read from the store and kept for `REFRESH_S` seconds."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._by_tenant: dict[str, frozenset[str]] = {}
        self._read_at: float | None = None

    def forget(self) -> None:
        """Read the lists again on the next request (a tenant's config changed)."""
        self._read_at = None

    async def by_tenant(self, sessions: Database) -> dict[str, frozenset[str]]:
        now = self._clock()
        if self._read_at is None or now - self._read_at >= REFRESH_S:
            try:
                async with sessions() as db:
                    self._by_tenant = await tenants.cors_origins(db)
            except StoreError as exc:  # the request itself answers 503; allow nothing new
                log.warning("CORS origins not read: %s", exc)
            self._read_at = now
        return self._by_tenant


class TenantCors:
    def __init__(self, app: ASGIApp, origins: AllowedOrigins) -> None:
        self.app = app
        self.origins = origins

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        origin = _header(scope, b"origin") if scope["type"] == "http" else None
        if origin is None:
            await self.app(scope, receive, send)
            return
        by_tenant = await self.origins.by_tenant(scope["app"].state.autocommit_sessions)
        listed = any(origin in each for each in by_tenant.values())
        preflight = scope["method"] == "OPTIONS" and _header(
            scope, b"access-control-request-method"
        )
        if preflight and listed:
            await _preflight(origin, send)
            return
        state: dict[str, Any] = scope.setdefault("state", {})

        async def send_with_cors(message: Message) -> None:
            if message["type"] == "http.response.start":
                tenant = state.get("tenant_id")
                allowed = listed if tenant is None else origin in by_tenant.get(tenant, ())
                headers = list(message.get("headers", []))
                headers.append((b"vary", b"Origin"))
                if allowed:
                    headers.append((b"access-control-allow-origin", origin.encode()))
                    headers.append((b"access-control-expose-headers", EXPOSED_HEADERS.encode()))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_cors)


async def _preflight(origin: str, send: Send) -> None:
    headers = [
        (b"access-control-allow-origin", origin.encode()),
        (b"access-control-allow-methods", METHODS.encode()),
        (b"access-control-allow-headers", REQUEST_HEADERS.encode()),
        (b"access-control-max-age", str(MAX_AGE_S).encode()),
        (b"vary", b"Origin"),
        (b"content-length", b"0"),
    ]
    await send({"type": "http.response.start", "status": 204, "headers": headers})
    await send({"type": "http.response.body", "body": b""})


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope["headers"]:
        if key == name:
            return str(value.decode("latin-1"))
    return None
