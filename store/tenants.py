"""Tenant switches and configuration (admin)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from parley.errors import NotFound
from parley.store.models import Tenant
from parley.store.rows import typed_row
from parley.tenancy import TenantConfig


@dataclass(frozen=True)
class TenantRow:
    """A tenant's switch and its configuration as stored (`{}` for an old row's NULL)."""

    id: str
    paused: bool
    config: dict[str, Any]


async def get_tenant(db: AsyncSession, *, tenant_id: str) -> TenantRow:
    return _tenant(await _stored(db, tenant_id))


def _tenant(row: Tenant) -> TenantRow:
    # An unset configuration is NULL on old rows; the contract says `{}`.
    return typed_row(TenantRow, row, config=dict(row.config or {}))


async def _stored(db: AsyncSession, tenant_id: str) -> Tenant:
    tenant = await db.get(Tenant, tenant_id)
    if tenant is None:
        raise NotFound("tenant not found")
    return tenant


async def tenant_config(db: AsyncSession, *, tenant_id: str) -> TenantConfig:
    """The tenant's configuration over the code defaults (empty when the tenant is unknown)."""
    tenant = await db.get(Tenant, tenant_id)
    return TenantConfig.model_validate(tenant.config if tenant is not None else {})


async def set_paused(db: AsyncSession, *, tenant_id: str, paused: bool) -> TenantRow:
    tenant = await _stored(db, tenant_id)
    tenant.paused = paused
    await db.flush()
    return _tenant(tenant)


async def set_config(db: AsyncSession, *, tenant_id: str, config: TenantConfig) -> TenantRow:
    tenant = await _stored(db, tenant_id)
    tenant.config = config.model_dump(exclude_none=True)
    await db.flush()
    return _tenant(tenant)


async def is_paused(db: AsyncSession, *, tenant_id: str) -> bool:
    """Whether the tenant's assistant is switched off: work that would start or go on
    (a turn, a model call, a send, a confirmation) fails closed."""
    tenant = await db.get(Tenant, tenant_id, populate_existing=True)
    return tenant is not None and tenant.paused
