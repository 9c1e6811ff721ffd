"""Tenants, users and bearer tokens."""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from parley.features import ASSISTANT
from parley.ids import new_id
from parley.store.db import Db


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
    db: Db, *, tenant_id: str, user_id: str, ttl: timedelta | None = None
) -> str:
    """Mint a token for the user; with `ttl` it is refused once that long has passed."""
    token = "pk_" + secrets.token_urlsafe(32)
    params: dict[str, Any] = {"id": new_id("tok"), "tenant_id": tenant_id, "user_id": user_id}
    params |= {"token_hash": hash_token(token), "ttl": ttl}
    if await db.value(_CREATE_TOKEN, params) is None:
        raise LookupError(f"unknown user {user_id!r} in tenant {tenant_id!r}")
    return token


# Inserted only for a user who exists (no row: unknown). The expiry is by the database's
# clock, the same one `identity_for_token` compares with.
_CREATE_TOKEN = """
    INSERT INTO api_tokens (id, tenant_id, user_id, token_hash, expires_at)
    SELECT %(id)s, tenant_id, id, %(token_hash)s, now() + CAST(%(ttl)s AS interval)
    FROM users WHERE tenant_id = %(tenant_id)s AND id = %(user_id)s
    RETURNING id
"""


async def revoke_token(db: Db, *, token: str) -> bool:
    """Revoke one token; False if it is unknown or already revoked. Every request looks its
    token up again, so the next request with it is refused."""
    return bool(await db.run(_REVOKE_TOKEN, {"token_hash": hash_token(token)}))


async def revoke_user_tokens(db: Db, *, tenant_id: str, user_id: str) -> int:
    """Revoke every live token of one user (a lost device, a departed employee)."""
    return await db.run(_REVOKE_USER_TOKENS, {"tenant_id": tenant_id, "user_id": user_id})


_REVOKE_TOKEN = """
    UPDATE api_tokens SET revoked_at = now()
    WHERE token_hash = %(token_hash)s AND revoked_at IS NULL
"""
_REVOKE_USER_TOKENS = """
    UPDATE api_tokens SET revoked_at = now()
    WHERE tenant_id = %(tenant_id)s AND user_id = %(user_id)s AND revoked_at IS NULL
"""


async def identity_for_token(db: Db, *, token: str) -> Identity | None:
    """The caller behind a live token: not revoked and not expired (by the database's clock,
    so every API process agrees). On the session's own connection, in its transaction: every
    request runs it, and a statement through the session costs several times its round trip
    in Python (store/db.py `Db`)."""
    async with db.together():  # with the `BEGIN` of the request's unit of work: one round trip
        found = await db.send_made(_IDENTITY, {"token_hash": hash_token(token)}, _identity)
    return await found.row()


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


@dataclass(frozen=True)
class _Known:
    issuer: str | None
    display_name: str
    roles: list[str] | None
    features: list[str] | None


async def external_identity(
    db: Db, *, tenant_id: str, issuer: str, user_id: str, display_name: str, roles: tuple[str, ...]
) -> Identity | None:
    """The caller a verified identity provider token names (parley/oidc.py), its user row
    made on first sight from the claims; None when the id is a user another origin made
    (seeded, the CLI, another issuer), whom this issuer's tokens never reach.

    On an autocommit connection: the row is made once whether or not the request that first
    saw the user goes on to commit, and two first requests at once make one row (the insert
    does nothing on a conflict and the row is read again). The roles are the token's on
    every request; the row follows the claims' name and roles only when they changed, so
    a request does not write or lock it.
    """
    params = {"tenant_id": tenant_id, "user_id": user_id}
    known = await db.row(_KNOWN, params, _Known)
    if known is None:
        made = params | {"issuer": issuer, "display_name": display_name, "roles": list(roles)}
        await db.run(_MAKE_EXTERNAL, made)
        known = await db.row(_KNOWN, params, _Known)
    if known is None or known.issuer != issuer:
        return None
    if known.display_name != display_name or tuple(known.roles or ()) != roles:
        changed = params | {"display_name": display_name, "roles": list(roles)}
        await db.run(_FOLLOW_CLAIMS, changed)
    return Identity(tenant_id, user_id, roles, tuple(known.features or ()))


_KNOWN = """
    SELECT issuer, display_name, roles, features FROM users
    WHERE tenant_id = %(tenant_id)s AND id = %(user_id)s
"""
_MAKE_EXTERNAL = """
    INSERT INTO users (tenant_id, id, display_name, roles, issuer)
    VALUES (%(tenant_id)s, %(user_id)s, %(display_name)s, CAST(%(roles)s AS varchar[]),
        %(issuer)s)
    ON CONFLICT DO NOTHING
"""
_FOLLOW_CLAIMS = """
    UPDATE users SET display_name = %(display_name)s, roles = CAST(%(roles)s AS varchar[])
    WHERE tenant_id = %(tenant_id)s AND id = %(user_id)s
"""


async def set_feature(db: Db, *, tenant_id: str, user_id: str, feature: str, enabled: bool) -> bool:
    """Grant or revoke one feature of a user (the caller commits); False for an unknown user.
    Every request reads the features with its token, so the next request sees the change."""
    params = {"tenant_id": tenant_id, "user_id": user_id, "feature": feature}
    return bool(await db.run(_SET_FEATURE, params | {"enabled": enabled}))


# The feature taken out, and put back last when it is granted.
_SET_FEATURE = """
    UPDATE users SET features = CASE WHEN %(enabled)s
        THEN array_append(array_remove(coalesce(features, '{}'), %(feature)s), %(feature)s)
        ELSE array_remove(coalesce(features, '{}'), %(feature)s) END
    WHERE tenant_id = %(tenant_id)s AND id = %(user_id)s
"""


# The Northwind demo of design.md and api.md: two customers of one tenant, one of another
# tenant (for isolation), an operator with the admin role, and support agents (role `agent`,
# the hand-off inbox: two of Northwind's, one of Southwind's).
DEMO_TENANTS = {"northwind": "Northwind Outfitters", "southwind": "Southwind Supplies"}
DEMO_USERS = [
    ("northwind", "cust_2291", "Priya", "priya@example.com", []),
    ("northwind", "cust_3301", "Marco", "marco@example.com", []),
    ("southwind", "cust_9001", "Ines", "ines@example.com", []),
    # Dana's business account: the result-set conversation of design.md.
    ("northwind", "cust_4410", "Dana", "dana@example.com", []),
    ("northwind", "ops_admin", "Northwind operator", None, ["admin"]),
    ("northwind", "agent_sam", "Sam", None, ["agent"]),
    ("northwind", "agent_lee", "Lee", None, ["agent"]),
    ("southwind", "agent_kim", "Kim", None, ["agent"]),
]


async def seed_demo(db: Db) -> None:
    """Insert the demo tenants and users (the caller commits); running it again changes
    nothing."""
    for tenant_id, name in DEMO_TENANTS.items():
        await db.run(_SEED_TENANT, {"id": tenant_id, "name": name})
    for tenant_id, user_id, display_name, email, roles in DEMO_USERS:
        params = {"tenant_id": tenant_id, "id": user_id, "display_name": display_name}
        await db.run(_SEED_USER, params | {"email": email, "roles": roles})


_SEED_TENANT = "INSERT INTO tenants (id, name) VALUES (%(id)s, %(name)s) ON CONFLICT DO NOTHING"
_SEED_USER = """
    INSERT INTO users (tenant_id, id, display_name, email, roles)
    VALUES (%(tenant_id)s, %(id)s, %(display_name)s, %(email)s, CAST(%(roles)s AS varchar[]))
    ON CONFLICT DO NOTHING
"""


@dataclass(frozen=True)
class UserRow:
    """A user as the page and the prompt name them."""

    tenant_id: str
    id: str
    display_name: str


async def demo_customers(db: Db) -> list[UserRow]:
    """The seeded demo users without roles (customers), in seeding order: the people the dev
    sign-in offers. Users another seed adds to `DEMO_USERS` appear once they are stored."""
    customers = [(t, u) for t, u, _, _, roles in DEMO_USERS if not roles]
    params = {"tenants": [t for t, _ in customers], "users": [u for _, u in customers]}
    rows = await db.rows(_CUSTOMERS, params, UserRow)
    found = {(user.tenant_id, user.id): user for user in rows}
    return [found[key] for key in customers if key in found]


# A stored user who has since been given a role is no longer offered.
_CUSTOMERS = """
    SELECT tenant_id, id, display_name FROM users
    WHERE (tenant_id, id) IN (
        SELECT * FROM unnest(CAST(%(tenants)s AS text[]), CAST(%(users)s AS text[])))
        AND coalesce(cardinality(roles), 0) = 0
"""


async def get_user(db: Db, *, tenant_id: str, user_id: str) -> UserRow | None:
    return await db.row(_USER, {"tenant_id": tenant_id, "user_id": user_id}, UserRow)


_USER = """
    SELECT tenant_id, id, display_name FROM users
    WHERE tenant_id = %(tenant_id)s AND id = %(user_id)s
"""
