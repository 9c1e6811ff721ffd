"""Database chores the CLI and the dev supervisor share: tokens and the demo seed.

Each opens its own small engine, does one unit of work, commits and disposes it: these run
once from a command line, not on a request path.
"""

from __future__ import annotations

import sys
from datetime import timedelta

from parley.config import Settings
from parley.mcp import McpServerConfig
from parley.store import identity, tenants
from parley.store.db import Database, create_engine
from parley.tenancy import TenantConfig


def require_database(settings: Settings) -> str:
    if settings.database_url is None:
        sys.exit(
            "DATABASE_URL is not set and no `parley dev` is running in "
            f"{settings.data_dir}; `parley dev` starts an embedded database"
        )
    return settings.database_url


async def create_token(
    settings: Settings, tenant: str, user: str, ttl: timedelta | None = None
) -> str:
    engine = create_engine(require_database(settings), pool_size=1)
    try:
        async with Database(engine)() as db:
            token = await identity.create_token(db, tenant_id=tenant, user_id=user, ttl=ttl)
            await db.commit()
            return token
    finally:
        await engine.dispose()


async def revoke_tokens(
    settings: Settings, *, token: str | None, tenant: str | None, user: str | None
) -> int:
    """Revoke one token, or every token of one user; returns how many were revoked."""
    engine = create_engine(require_database(settings), pool_size=1)
    try:
        async with Database(engine)() as db:
            if token is not None:
                revoked = int(await identity.revoke_token(db, token=token))
            else:
                assert tenant is not None and user is not None
                revoked = await identity.revoke_user_tokens(db, tenant_id=tenant, user_id=user)
            await db.commit()
            return revoked
    finally:
        await engine.dispose()


def demo_mcp_server(northwind_url: str) -> McpServerConfig:
    """The demo backend's MCP server as tenant `northwind` uses it: store hours and product
    search to read, a store pickup reservation that only the user's confirm makes. The
    backend also serves a staff-only export that no allow-list names."""
    return McpServerConfig(
        name="northwind_mcp",
        url=f"{northwind_url.rstrip('/')}/mcp",
        allowed_tools=["get_store_hours", "search_products", "reserve_in_store_pickup"],
        risk={"reserve_in_store_pickup": "write"},
    )


# Skills tenant `northwind` runs in the demo: its orders drawn as a chart by week.
DEMO_SKILLS = ("spending_chart",)


def demo_tenant_config(config: TenantConfig, northwind_url: str) -> TenantConfig:
    """Tenant `northwind` as the demo shows it, over what it holds: the backend's MCP server
    at this run's URL (it may change between runs), the demo's sandboxed skill (beside any the
    tenant enables) and the Returns specialist (parley/specialists.py). Its other settings and
    servers are kept."""
    mcp = demo_mcp_server(northwind_url)
    servers = [s for s in config.mcp_servers or [] if s.name != mcp.name] + [mcp]
    enabled = config.skills or []
    skills = [*enabled, *(s for s in DEMO_SKILLS if s not in enabled)]
    # An operator who switched specialists off explicitly keeps them off.
    specialists = True if config.specialists is None else config.specialists
    update = {"mcp_servers": servers, "skills": skills, "specialists": specialists}
    return config.model_copy(update=update)


async def seed(settings: Settings) -> None:
    """The demo's tenants, users, `northwind`'s configuration and knowledge documents: what
    `make run` shows, and what a test that runs the demo as it is seeds the same way."""
    engine = create_engine(require_database(settings), pool_size=1)
    try:
        async with Database(engine)() as db:
            await identity.seed_demo(db)
            config = await tenants.tenant_config(db, tenant_id="northwind")
            await tenants.set_config(
                db,
                tenant_id="northwind",
                config=demo_tenant_config(config, settings.northwind_url),
            )
            await db.commit()
    finally:
        await engine.dispose()
    # The demo tenants' knowledge documents (launch/knowledge/).
    from parley.launch.knowledge import load_knowledge  # the seed alone loads documents

    await load_knowledge(settings)


async def set_feature(
    settings: Settings, *, tenant: str, user: str, feature: str, enabled: bool
) -> bool:
    """Grant or revoke a user's feature; False when there is no such user."""
    engine = create_engine(require_database(settings), pool_size=1)
    try:
        async with Database(engine)() as db:
            found = await identity.set_feature(
                db, tenant_id=tenant, user_id=user, feature=feature, enabled=enabled
            )
            await db.commit()
            return found
    finally:
        await engine.dispose()
