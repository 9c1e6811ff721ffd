"""Tenant switches and configuration (admin)."""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncSession

from parley.errors import NotFound
from parley.tenancy import TenantConfig
from store.models import Tenant


async def get_tenant(db: AsyncSession, *, tenant_id: str) -> Tenant:
    tenant = await db.get(Tenant, tenant_id)
    if tenant is None:
        raise NotFound("tenant not found")
    return tenant


async def tenant_config(db: AsyncSession, *, tenant_id: str) -> TenantConfig:
    """The tenant's configuration over the code defaults (empty when the tenant is unknown)."""
    tenant = await db.get(Tenant, tenant_id)
    return TenantConfig.model_validate(tenant.config if tenant is not None else {})


async def set_paused(db: AsyncSession, *, tenant_id: str, paused: bool) -> Tenant:
    tenant = await get_tenant(db, tenant_id=tenant_id)
    tenant.paused = paused
    await db.flush()
    return tenant


async def set_config(db: AsyncSession, *, tenant_id: str, config: TenantConfig) -> Tenant:
    tenant = await get_tenant(db, tenant_id=tenant_id)
    tenant.config = config.model_dump(exclude_none=True)
    await db.flush()
    return tenant


async def is_paused(db: AsyncSession, *, tenant_id: str) -> bool:
    """Whether the tenant's assistant is switched off: work that would start or go on
    (a turn, a model call, a send, a confirmation) fails closed."""
    tenant = await db.get(Tenant, tenant_id, populate_existing=True)
    return tenant is not None and tenant.paused
