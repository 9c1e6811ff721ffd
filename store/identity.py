"""Tenants, users and bearer tokens."""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy import func, select, tuple_, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession

from parley.features import ASSISTANT
from parley.ids import new_id
from parley.store.db import session_conn
from parley.store.models import ApiToken, Tenant, User
from parley.store.rows import typed_row


@dataclass(frozen=True)
class Identity:
    """Who is calling: taken only from the token, never from a body or query field."""

    tenant_id: str
    user_id: str
    roles: tuple[str, ...]
    # What the user may use (parley/features.py); read with the token, so checking it costs
    # no query.
    features: tuple[str, ...] = (ASSISTANT,)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


async def create_token(
    db: AsyncSession, *, tenant_id: str, user_id: str, ttl: timedelta | None = None
) -> str:
    """Mint a token for the user; with `ttl` it is refused once that long has passed."""
    user = await db.get(User, (tenant_id, user_id))
    if user is None:
        raise LookupError(f"unknown user {user_id!r} in tenant {tenant_id!r}")
    token = "pk_" + secrets.token_urlsafe(32)
    db.add(
        ApiToken(
            id=new_id("tok"),
            tenant_id=tenant_id,
            user_id=user_id,
            token_hash=hash_token(token),
            # The database's clock, the same one `identity_for_token` compares with.
            expires_at=func.now() + ttl if ttl is not None else None,
        )
    )
    await db.flush()
    return token


async def revoke_token(db: AsyncSession, *, token: str) -> bool:
    """Revoke one token; False if it is unknown or already revoked. Every request looks its
    token up again, so the next request with it is refused."""
    result = await db.execute(
        update(ApiToken)
        .where(ApiToken.token_hash == hash_token(token), ApiToken.revoked_at.is_(None))
        .values(revoked_at=func.now())
    )
    return bool(result.rowcount)  # type: ignore[attr-defined]


async def revoke_user_tokens(db: AsyncSession, *, tenant_id: str, user_id: str) -> int:
    """Revoke every live token of one user (a lost device, a departed employee)."""
    result = await db.execute(
        update(ApiToken)
        .where(
            ApiToken.tenant_id == tenant_id,
            ApiToken.user_id == user_id,
            ApiToken.revoked_at.is_(None),
        )
        .values(revoked_at=func.now())
    )
    return int(result.rowcount)  # type: ignore[attr-defined]


async def identity_for_token(db: AsyncSession, *, token: str) -> Identity | None:
    """The caller behind a live token: not revoked and not expired (by the database's clock,
    so every API process agrees). On the session's own connection, in its transaction: every
    request runs it, and a statement through the session costs several times its round trip
    in Python (store/db.py `Conn`)."""
    conn = await session_conn(db)
    return await conn.made(_IDENTITY, {"token_hash": hash_token(token)}, _identity)


def _identity(
    *, tenant_id: str, user_id: str, roles: list[str] | None, features: list[str] | None
) -> Identity:
    return Identity(tenant_id, user_id, tuple(roles or ()), tuple(features or ()))


# Built once (other modules' statements that every request runs point here): a statement of
# ORM columns goes through the ORM's compile and result setup on each run, and even a plain
# text one through the session's execution machinery.
_IDENTITY = """
    SELECT t.tenant_id, t.user_id, u.roles, u.features
    FROM api_tokens AS t JOIN users AS u ON u.tenant_id = t.tenant_id AND u.id = t.user_id
    WHERE t.token_hash = %(token_hash)s AND t.revoked_at IS NULL
        AND (t.expires_at IS NULL OR t.expires_at > now())
"""


async def set_feature(
    db: AsyncSession, *, tenant_id: str, user_id: str, feature: str, enabled: bool
) -> bool:
    """Grant or revoke one feature of a user (the caller commits); False for an unknown user.
    Every request reads the features with its token, so the next request sees the change."""
    user = await db.get(User, (tenant_id, user_id), with_for_update=True)
    if user is None:
        return False
    current = [f for f in user.features or [] if f != feature]
    user.features = [*current, feature] if enabled else current
    await db.flush()
    return True


# The Northwind demo of design.md and api.md: two customers of one tenant, one of another
# tenant (for isolation), and an operator with the admin role.
DEMO_TENANTS = {"northwind": "Northwind Outfitters", "southwind": "Southwind Supplies"}
DEMO_USERS = [
    ("northwind", "cust_2291", "Priya", "priya@example.com", []),
    ("northwind", "cust_3301", "Marco", "marco@example.com", []),
    ("southwind", "cust_9001", "Ines", "ines@example.com", []),
    # Dana's business account: the result-set conversation of design.md.
    ("northwind", "cust_4410", "Dana", "dana@example.com", []),
    ("northwind", "ops_admin", "Northwind operator", None, ["admin"]),
]


async def seed_demo(db: AsyncSession) -> None:
    """Insert the demo tenants and users (the caller commits); running it again changes
    nothing."""
    for tenant_id, name in DEMO_TENANTS.items():
        await db.execute(insert(Tenant).values(id=tenant_id, name=name).on_conflict_do_nothing())
    for tenant_id, user_id, display_name, email, roles in DEMO_USERS:
        await db.execute(
            insert(User)
            .values(
                tenant_id=tenant_id, id=user_id, display_name=display_name, email=email, roles=roles
            )
            .on_conflict_do_nothing()
        )


@dataclass(frozen=True)
class UserRow:
    """A user as the page and the prompt name them."""

    tenant_id: str
    id: str
    display_name: str


async def demo_customers(db: AsyncSession) -> list[UserRow]:
    """The seeded demo users without roles (customers), in seeding order: the people the dev
    sign-in offers. Users another seed adds to `DEMO_USERS` appear once they are stored."""
    customers = [(t, u) for t, u, _, _, roles in DEMO_USERS if not roles]
    rows = await db.scalars(select(User).where(tuple_(User.tenant_id, User.id).in_(customers)))
    # A stored user who has since been given a role is no longer offered.
    found = {(user.tenant_id, user.id): user for user in rows if not user.roles}
    return [typed_row(UserRow, found[key]) for key in customers if key in found]


async def get_user(db: AsyncSession, *, tenant_id: str, user_id: str) -> UserRow | None:
    """The user (from the session's identity map when it holds it)."""
    row = await db.get(User, (tenant_id, user_id))
    return None if row is None else typed_row(UserRow, row)
