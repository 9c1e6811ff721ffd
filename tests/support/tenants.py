"""Throwaway tenants: a tenant row of a test's own, with an admin user and a token of theirs,
for tests that pause, reconfigure or otherwise change a tenant. Northwind and southwind are
shared by every test of the session (and by the other process's), so changing them would
break tests that run beside or after."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from parley.store.db import Database
from parley.store.identity import create_token
from parley.store.models import Tenant, User
from tests.support.orm import orm


@dataclass(frozen=True)
class AdminTenant:
    """A tenant made for one test and its operator's token."""

    tenant_id: str
    admin_id: str
    token: str


async def new_admin_tenant(sessions: Database, *, prefix: str = "tmp") -> AdminTenant:
    """Store a fresh tenant (default configuration, not paused) with one user holding the
    admin role; that user's token."""
    tag = uuid.uuid4().hex[:8]
    # Unique ids both: a test that looks a user up by id alone never finds this one.
    tenant_id, admin_id = f"{prefix}_{tag}", f"ops_{tag}"
    async with orm(sessions) as db:
        db.add(Tenant(id=tenant_id, name=f"Throwaway {tenant_id}"))
        await db.flush()
        db.add(User(tenant_id=tenant_id, id=admin_id, display_name="Operator", roles=["admin"]))
        await db.commit()
    async with sessions() as db:
        token = await create_token(db, tenant_id=tenant_id, user_id=admin_id)
        await db.commit()
    return AdminTenant(tenant_id, admin_id, token)


async def new_customer(sessions: Database, *, tenant_id: str, user_id: str) -> str:
    """Store a customer (no roles) of a throwaway tenant; their token."""
    async with orm(sessions) as db:
        db.add(User(tenant_id=tenant_id, id=user_id, display_name=user_id, roles=[]))
        await db.commit()
    async with sessions() as db:
        token = await create_token(db, tenant_id=tenant_id, user_id=user_id)
        await db.commit()
    return token
