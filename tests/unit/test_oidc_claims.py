"""A tenant's `oidc` block (parley/oidc.py): what it refuses when saved, and how verified
claims become a Parley user."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from parley.oidc import OidcConfig, TokenClaimsInvalid, looks_like_jwt, user_from_claims
from parley.tenancy import TenantConfig

BASE = {"issuer": "https://idp.example", "audience": "parley"}


@pytest.mark.parametrize("algorithm", ["none", "HS256", "HS512", "hs384", "NONE"])
def test_symmetric_and_no_algorithms_are_refused(algorithm: str) -> None:
    with pytest.raises(ValidationError, match="only asymmetric algorithms"):
        OidcConfig.model_validate(BASE | {"algorithms": ["RS256", algorithm]})


def test_an_unknown_algorithm_is_refused() -> None:
    with pytest.raises(ValidationError, match="is not one of"):
        OidcConfig.model_validate(BASE | {"algorithms": ["RS1"]})


def test_the_key_set_comes_from_the_jwks_url_or_a_discovery_document() -> None:
    assert OidcConfig.model_validate(BASE).keys_at == (
        "discovery",
        "https://idp.example/.well-known/openid-configuration",
    )
    jwks = OidcConfig.model_validate(BASE | {"jwks_url": "https://idp.example/k"})
    assert jwks.keys_at == ("jwks", "https://idp.example/k")
    both = jwks.model_copy(update={"discovery_url": "https://idp.example/d"})
    assert both.keys_at == ("jwks", "https://idp.example/k")  # the key set, when named
    # Stored and read back through the tenant's config.
    config = TenantConfig.model_validate({"oidc": BASE})
    assert TenantConfig.model_validate(config.model_dump(exclude_none=True)) == config


def test_claims_give_the_user_id_name_and_roles() -> None:
    keycloak = OidcConfig.model_validate(
        BASE | {"user_id_claim": "preferred_username", "roles_claim": "realm_access.roles"}
    )
    claims: dict[str, Any] = {
        "sub": "f3b1",
        "preferred_username": "alice",
        "name": "Alice",
        "realm_access": {"roles": ["agent", "agent"]},
    }
    user = user_from_claims(claims, keycloak)
    assert (user.user_id, user.display_name, user.roles) == ("alice", "Alice", ("agent",))
    spaced = OidcConfig.model_validate(BASE | {"roles_claim": "scope"})
    assert user_from_claims({"sub": "a", "scope": "admin agent"}, spaced).roles == (
        "admin",
        "agent",
    )
    # No name claim: the id names them; no roles claim configured: no roles.
    plain = user_from_claims({"sub": "bob", "roles": ["admin"]}, OidcConfig.model_validate(BASE))
    assert (plain.display_name, plain.roles) == ("bob", ())


@pytest.mark.parametrize(
    "claims",
    [
        {},
        {"sub": ""},
        {"sub": 7},
        {"sub": "x" * 65},
        {"sub": "a", "roles": 5},
        {"sub": "a", "roles": ["r" * 33]},
    ],
)
def test_unusable_claims_are_refused(claims: dict[str, Any]) -> None:
    config = OidcConfig.model_validate(BASE | {"roles_claim": "roles"})
    with pytest.raises(TokenClaimsInvalid):
        user_from_claims(claims, config)


def test_a_jwt_is_told_from_a_parley_token() -> None:
    assert looks_like_jwt("eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJhIn0.c2ln")
    assert not looks_like_jwt("pk_abc.def.ghi")
    assert not looks_like_jwt("eyJhbGciOiJSUzI1NiJ9.only-two")
