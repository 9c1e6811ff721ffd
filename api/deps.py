"""Annotated dependencies shared by the routers."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence
from typing import Annotated

from fastapi import Depends, Header, Query, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import WithJsonSchema
from temporalio.client import Client, Interceptor

from parley.api.streaming import EventHub, StreamRegistry
from parley.config import Settings
from parley.errors import Forbidden, NotFound, Unauthenticated
from parley.jwks import KeySets
from parley.logs import bind_log_context
from parley.oidc import (
    TokenClaimsInvalid,
    TokenUnknownIssuer,
    looks_like_jwt,
    unverified_issuer,
    user_from_claims,
    verify,
)
from parley.store import tenants
from parley.store.db import Database, Db
from parley.store.identity import Identity, external_identity, identity_for_token

log = logging.getLogger(__name__)


class TemporalConnector:
    """Connects lazily and reconnects after failures, so the API starts without Temporal."""

    def __init__(self, settings: Settings, interceptors: Sequence[Interceptor] = ()) -> None:
        self._settings = settings
        # Client interceptors: tests use one to lose a delivery on purpose.
        self._interceptors = list(interceptors)
        self._client: Client | None = None
        self._lock = asyncio.Lock()

    async def get(self) -> Client:
        if self._client is None:
            async with self._lock:
                if self._client is None:
                    self._client = await Client.connect(
                        self._settings.temporal_address,
                        namespace=self._settings.temporal_namespace,
                        interceptors=self._interceptors,
                    )
        return self._client


# The getters below are `async def` though they never await: FastAPI runs a plain `def`
# dependency in its thread pool, a thread hop per dependency per request.


async def get_settings_dep(request: Request) -> Settings:
    return request.app.state.settings


async def get_sessions(request: Request) -> Database:
    return request.app.state.sessions


async def get_autocommit_sessions(request: Request) -> Database:
    return request.app.state.autocommit_sessions


async def get_db(request: Request) -> AsyncIterator[Db]:
    async with request.app.state.sessions() as db:
        yield db


async def get_temporal(request: Request) -> TemporalConnector:
    return request.app.state.temporal


async def get_hub(request: Request) -> EventHub:
    return request.app.state.hub


async def get_streams(request: Request) -> StreamRegistry:
    return request.app.state.streams


_bearer = HTTPBearer(auto_error=False)


async def current_identity(
    request: Request,
    db: Annotated[Db, Depends(get_db)],
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Identity:
    if credentials is None or not credentials.credentials:
        raise Unauthenticated("a bearer token is required")
    token = credentials.credentials
    if looks_like_jwt(token):
        state = request.app.state
        identity = await jwt_identity(db, state.autocommit_sessions, state.key_sets, token)
    else:
        found = await identity_for_token(db, token=token)
        if found is None:
            raise Unauthenticated("the bearer token is not valid")
        identity = found
    bind_log_context(tenant_id=identity.tenant_id)  # every line of this request names it
    # Which tenant answers: its CORS allow-list applies to the response (api/cors.py).
    request.state.tenant_id = identity.tenant_id
    return identity


async def jwt_identity(db: Db, autocommit: Database, keys: KeySets, token: str) -> Identity:
    """The caller behind a tenant's identity provider token (parley/oidc.py): the tenant its
    `iss` names, the claims verified against that tenant's config, the user made on first
    sight. Each refusal is a `TokenRefused` naming why."""
    issuer = unverified_issuer(token)
    found = await tenants.tenants_of_issuer(db, issuer=issuer)
    if len(found) != 1 or found[0][1].oidc is None:  # none, or two (refused when saved)
        raise TokenUnknownIssuer(f"no tenant signs in with issuer {issuer!r}")
    tenant_id, config = found[0][0], found[0][1].oidc
    user = user_from_claims(await verify(token, config, keys), config)
    async with autocommit() as made:
        identity = await external_identity(
            made,
            tenant_id=tenant_id,
            issuer=issuer,
            user_id=user.user_id,
            display_name=user.display_name,
            roles=user.roles,
        )
    if identity is None:
        raise TokenClaimsInvalid(f"user {user.user_id!r} was not made by this issuer")
    return identity


AppSettings = Annotated[Settings, Depends(get_settings_dep)]
DbSession = Annotated[Db, Depends(get_db)]
Sessions = Annotated[Database, Depends(get_sessions)]
# Sessions without a transaction, for work that is one statement (store/db.py).
AutocommitSessions = Annotated[Database, Depends(get_autocommit_sessions)]
CurrentUser = Annotated[Identity, Depends(current_identity)]


def require_admin(tenant_id: str, user: CurrentUser) -> Identity:
    """The caller, when they administer the tenant of the path (`tenant_id`): 403 without
    the admin role, 404 for any other tenant (as for any resource not the caller's)."""
    if "admin" not in user.roles:
        raise Forbidden("this needs the admin role")
    if tenant_id != user.tenant_id:
        raise NotFound("tenant not found")
    return user


Admin = Annotated[Identity, Depends(require_admin)]
Temporal = Annotated[TemporalConnector, Depends(get_temporal)]
Hub = Annotated[EventHub, Depends(get_hub)]
Streams = Annotated[StreamRegistry, Depends(get_streams)]


# Where an event stream resumes: the `Last-Event-ID` a browser's EventSource sends when it
# reconnects (absent, not null: a header has no null to send), or `?after=` from a client that
# cannot set headers.
LAST_EVENT_ID = r"^[0-9]{1,18}$"
LastEventId = Annotated[
    str | None,
    Header(pattern=LAST_EVENT_ID),
    WithJsonSchema({"type": "string", "pattern": LAST_EVENT_ID}),
]
After = Annotated[int | None, Query(ge=0)]


def resume_after(last_event_id: str | None, after: int | None) -> int:
    """The last event id the client has; 0 for a stream from its start."""
    return int(last_event_id) if last_event_id is not None else (after or 0)
