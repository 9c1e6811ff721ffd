"""Operator switches for a tenant: pause and resume the assistant, its configuration, and
what its model calls cost.

Admins manage their own tenant only; any other tenant is 404, as for any resource that is
not the caller's.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from fastapi import APIRouter, Query, Request
from pydantic import BaseModel

from parley.api.deps import Admin, AppSettings, DbSession
from parley.api.errors import answers
from parley.api.schemas import SessionRunsOut, TenantOut, UsageOut
from parley.egress import check_url
from parley.errors import Forbidden, InvalidRequest, NotFound, UrlNotAllowed
from parley.gateway.resolver import system_resolver
from parley.store import tenants, usage, webhooks
from parley.tenancy import TenantConfig
from parley.wire import Timestamp

router = APIRouter(
    prefix="/v1/admin/tenants/{tenant_id}",
    tags=["admin"],
    responses=answers(Forbidden, NotFound),
)


@router.post("/pause")
async def pause(tenant_id: str, db: DbSession, _: Admin) -> TenantOut:
    """Switch the tenant's assistant off: new messages get 403 `agent_paused`."""
    tenant = await tenants.set_paused(db, tenant_id=tenant_id, paused=True)
    await db.commit()
    return TenantOut.from_row(tenant)


@router.post("/resume")
async def resume(tenant_id: str, db: DbSession, _: Admin) -> TenantOut:
    """Switch the tenant's assistant back on."""
    tenant = await tenants.set_paused(db, tenant_id=tenant_id, paused=False)
    await db.commit()
    return TenantOut.from_row(tenant)


@router.get("/config")
async def get_config(tenant_id: str, db: DbSession, _: Admin) -> TenantOut:
    """The tenant's configuration over the code defaults."""
    return TenantOut.from_row(await tenants.get_tenant(db, tenant_id=tenant_id))


@router.put("/config", responses=answers(UrlNotAllowed))
async def put_config(
    tenant_id: str,
    config: TenantConfig,
    db: DbSession,
    _: Admin,
    settings: AppSettings,
    request: Request,
) -> TenantOut:
    """Replace the tenant's configuration (persona, model, tool allow-list, daily cap…); an
    MCP server or hand-off webhook the deployment may not reach is refused (`url_not_allowed`,
    naming the rule)."""
    unknown = set(config.tool_allowlist or ()) - TenantConfig.known_tools()
    if unknown:
        raise InvalidRequest(f"unknown tools: {sorted(unknown)}", field="tool_allowlist")
    urls = [
        (f"mcp_servers.{n}.url", server.url) for n, server in enumerate(config.mcp_servers or [])
    ]
    if config.handoff_webhook is not None:
        urls.append(("handoff_webhook.url", config.handoff_webhook.url))
    if config.oidc is not None:
        urls.append((f"oidc.{config.oidc.keys_at[0]}_url", config.oidc.keys_at[1]))
        await _issuer_is_free(db, tenant_id=tenant_id, issuer=config.oidc.issuer)
    for field, url in urls:
        await check_url(url, settings.mcp_allowlist, field=field, resolve=system_resolver)
    tenant = await tenants.set_config(db, tenant_id=tenant_id, config=config)
    await db.commit()
    request.app.state.cors_origins.forget()  # its origins apply from the next request
    return TenantOut.from_row(tenant)


async def _issuer_is_free(db: DbSession, *, tenant_id: str, issuer: str) -> None:
    """A token's `iss` names the one tenant it signs in to: an issuer is one tenant's."""
    if any(other != tenant_id for other, _ in await tenants.tenants_of_issuer(db, issuer=issuer)):
        raise InvalidRequest("another tenant signs in with this issuer", field="oidc.issuer")


@router.get("/usage")
async def get_usage(
    tenant_id: str, db: DbSession, _: Admin, days: int = Query(30, ge=1, le=366)
) -> UsageOut:
    """The tenant's model tokens over the last `days` days: its turns', its summarizer's, and
    both."""
    since = datetime.now(UTC) - timedelta(days=days)
    return UsageOut.from_usage(await usage.tenant_usage(db, tenant_id=tenant_id, since=since))


@router.get("/sessions/{session_id}/runs")
async def session_runs(tenant_id: str, session_id: str, db: DbSession, _: Admin) -> SessionRunsOut:
    """A session's turns, oldest first, each with its model tokens and its trace spans."""
    runs = await usage.session_turns(db, tenant_id=tenant_id, session_id=session_id)
    if runs is None:
        raise NotFound("session not found")
    return SessionRunsOut.build(session_id, runs)


class DeliveryView(BaseModel):
    """One delivery of the log: its id is the receiver's `Idempotency-Key`."""

    id: str
    handoff_id: str | None  # None: a budget event
    event: str
    url: str
    status: str
    attempts: int
    last_status_code: int | None
    last_error: str | None
    created_at: Timestamp
    delivered_at: Timestamp | None


class WebhookOut(BaseModel):
    url: str | None
    secret: str
    deliveries: list[DeliveryView]


@router.get("/webhook")
async def get_webhook(tenant_id: str, db: DbSession, _: Admin) -> WebhookOut:
    """The tenant's hand-off webhook: its URL, the secret its deliveries are signed with,
    and the delivery log (newest first)."""
    tenant = await tenants.get_tenant(db, tenant_id=tenant_id)
    secret = await webhooks.tenant_secret(db, tenant_id=tenant_id)
    assert secret is not None
    await db.commit()  # the secret, made at first use
    hook = TenantConfig.model_validate(tenant.config).handoff_webhook
    rows = await webhooks.deliveries(db, tenant_id=tenant_id)
    return WebhookOut(
        url=hook.url if hook is not None else None,
        secret=secret,
        deliveries=[DeliveryView.model_validate(row, from_attributes=True) for row in rows],
    )
