"""Database chores the CLI and the dev supervisor share: tokens and the demo seed.

Each opens its own small engine, does one unit of work, commits and disposes it: these run
once from a command line, not on a request path.
"""

from __future__ import annotations

import sys
from datetime import timedelta

from launch.knowledge import load_knowledge
from parley.config import Settings
from store import identity
from store.db import create_engine, session_factory


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
        async with session_factory(engine)() as db:
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
        async with session_factory(engine)() as db:
            if token is not None:
                revoked = int(await identity.revoke_token(db, token=token))
            else:
                assert tenant is not None and user is not None
                revoked = await identity.revoke_user_tokens(db, tenant_id=tenant, user_id=user)
            await db.commit()
            return revoked
    finally:
        await engine.dispose()


async def seed(settings: Settings) -> None:
    engine = create_engine(require_database(settings), pool_size=1)
    try:
        async with session_factory(engine)() as db:
            await identity.seed_demo(db)
            await db.commit()
    finally:
        await engine.dispose()
    # The demo tenants' knowledge documents (launch/knowledge/).
    await load_knowledge(settings)
