"""Tenant switches and configuration (admin)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from psycopg.types.json import Jsonb

from parley.errors import NotFound
from parley.store.db import Db
from parley.tenancy import TenantConfig

TENANT_NOT_FOUND = "tenant not found"


@dataclass(frozen=True)
class TenantRow:
    """A tenant's switch and its configuration as stored (`{}` for an old row's NULL)."""

    id: str
    paused: bool
    config: dict[str, Any]


async def get_tenant(db: Db, *, tenant_id: str) -> TenantRow:
    return _found(await db.made(_TENANT, {"tenant_id": tenant_id}, _tenant))


async def tenant_config(db: Db, *, tenant_id: str) -> TenantConfig:
    """The tenant's configuration over the code defaults (empty when the tenant is unknown)."""
    return TenantConfig.model_validate(await db.value(_CONFIG, {"tenant_id": tenant_id}) or {})


async def set_paused(db: Db, *, tenant_id: str, paused: bool) -> TenantRow:
    params = {"tenant_id": tenant_id, "paused": paused}
    return _found(await db.made(_SET_PAUSED, params, _tenant))


async def set_config(db: Db, *, tenant_id: str, config: TenantConfig) -> TenantRow:
    params = {"tenant_id": tenant_id, "config": Jsonb(config.model_dump(exclude_none=True))}
    return _found(await db.made(_SET_CONFIG, params, _tenant))


async def is_paused(db: Db, *, tenant_id: str) -> bool:
    """Whether the tenant's assistant is switched off: work that would start or go on
    (a turn, a model call, a send, a confirmation) fails closed. Read as it stands now."""
    return bool(await db.value(_PAUSED, {"tenant_id": tenant_id}))


async def tenants_of_issuer(db: Db, *, issuer: str) -> list[tuple[str, TenantConfig]]:
    """The tenants whose config names `issuer` for sign-in (one, when the configs are
    right: `PUT .../config` refuses an issuer another tenant has)."""
    rows = await db.rows(_OF_ISSUER, {"issuer": issuer}, TenantRow)
    return [(row.id, TenantConfig.model_validate(row.config)) for row in rows]


@dataclass(frozen=True)
class _Origins:
    id: str
    origins: list[str]


async def cors_origins(db: Db) -> dict[str, frozenset[str]]:
    """Each tenant's listed web origins (`TenantConfig.cors_origins`; api/cors.py)."""
    return {row.id: frozenset(row.origins) for row in await db.rows(_CORS, {}, _Origins)}


def _tenant(*, id: str, paused: bool, config: dict[str, Any] | None) -> TenantRow:
    # An unset configuration is NULL on old rows; the contract says `{}`.
    return TenantRow(id, paused, dict(config or {}))


def _found(tenant: TenantRow | None) -> TenantRow:
    if tenant is None:
        raise NotFound(TENANT_NOT_FOUND)
    return tenant


_TENANT = "SELECT id, paused, config FROM tenants WHERE id = %(tenant_id)s"
_CONFIG = "SELECT config FROM tenants WHERE id = %(tenant_id)s"
_OF_ISSUER = """
    SELECT id, paused, config FROM tenants WHERE config -> 'oidc' ->> 'issuer' = %(issuer)s
"""
_CORS = """
    SELECT id, ARRAY(SELECT jsonb_array_elements_text(config -> 'cors_origins')) AS origins
    FROM tenants WHERE jsonb_typeof(config -> 'cors_origins') = 'array'
"""
_PAUSED = "SELECT paused FROM tenants WHERE id = %(tenant_id)s"
_SET_PAUSED = """
    UPDATE tenants SET paused = %(paused)s WHERE id = %(tenant_id)s
    RETURNING id, paused, config
"""
_SET_CONFIG = """
    UPDATE tenants SET config = %(config)s WHERE id = %(tenant_id)s
    RETURNING id, paused, config
"""
