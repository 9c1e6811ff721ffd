"""Sign-in through a tenant's own identity provider: OpenID Connect access tokens (JWTs).

A tenant names its issuer in its config (`TenantConfig.oidc`): where its keys are (a
discovery document or a JWKS URL), the audience its tokens must carry, the algorithms it
signs with (asymmetric only), the clock skew it allows, and which claims give the user id,
the display name and the roles. A bearer token that looks like a JWT is verified against the
tenant whose issuer its `iss` names (api/deps.py); Parley's own `pk_` tokens stay for the
CLI, operators and the demo.

The user is whoever the verified claims say: the id from its claim (a row is made on first
sight, store/identity.py), the roles from its claim on every request, never from the request.
A user id that names a row the issuer did not make (a seeded or CLI-made user) is refused,
so an identity provider cannot take over a Parley user by choosing its subject.

Every refusal is a 401 with its own code, below (docs/api.md lists them):

    Unauthenticated
    └── TokenRefused                (any of these: the JWT is not accepted)
        ├── TokenMalformed          not a JWT, or its parts do not decode
        ├── TokenUnknownIssuer      `iss` names no tenant's issuer
        ├── TokenAlgorithmRefused   `alg` is not one the tenant accepts (`none`, HMAC: never)
        ├── TokenUnknownKey         `kid` is not in the issuer's key set (fetched again once)
        ├── TokenBadSignature       the signature does not verify (a changed payload, say)
        ├── TokenExpired            past `exp` (plus the clock skew)
        ├── TokenNotYetValid        before `nbf` or `iat` (minus the clock skew)
        ├── TokenWrongAudience      `aud` does not hold the tenant's audience
        └── TokenClaimsInvalid      a required claim is missing or unusable
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Protocol

import jwt
from jwt import PyJWK
from pydantic import BaseModel, ConfigDict, Field, field_validator

from parley.errors import Unauthenticated

# Signature algorithms with a public key: a verifier that holds only the issuer's public key
# can check them, and nobody can sign with it. HMAC (HS*) would need the secret on both
# sides (and an HS256 token "signed" with the public key is the classic confusion attack);
# `none` signs nothing.
ASYMMETRIC: tuple[str, ...] = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512")
ASYMMETRIC += ("ES256", "ES384", "ES512", "EdDSA")
Algorithm = Annotated[str, Field(json_schema_extra={"enum": list(ASYMMETRIC)})]
# A claim name, or a dotted path into nested claims (Keycloak's `realm_access.roles`).
ClaimPath = Annotated[str, Field(pattern=r"^[A-Za-z0-9_:/.\-]{1,100}$")]
# The bounds of the users table (store/models/core.py).
MAX_USER_ID = 64
MAX_DISPLAY_NAME = 200
MAX_ROLE = 32
MAX_ROLES = 20


class OidcConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)  # as TenantConfig

    # The `iss` its tokens carry, exactly; one tenant per issuer.
    issuer: str = Field(pattern=r"^https?://", max_length=300)
    # Where the key set is: the JWKS URL when given; else a discovery document naming it
    # (its `issuer` must be this issuer), by default the issuer's
    # `/.well-known/openid-configuration`.
    # Checked against the deployment's egress rules when saved (api/routes/admin.py).
    discovery_url: str | None = Field(default=None, pattern=r"^https?://", max_length=500)
    jwks_url: str | None = Field(default=None, pattern=r"^https?://", max_length=500)
    # What `aud` must hold (the API's identifier at the identity provider).
    audience: str = Field(min_length=1, max_length=300)
    algorithms: list[Algorithm] = Field(default=["RS256"], min_length=1, max_length=10)
    # Seconds a token's `exp`, `nbf` and `iat` may be off from this server's clock.
    clock_skew_s: float = Field(default=60.0, ge=0, le=300)
    user_id_claim: ClaimPath = "sub"
    display_name_claim: ClaimPath = "name"
    # A list of strings, or one space-separated string; None: the users hold no role.
    roles_claim: ClaimPath | None = None

    @field_validator("algorithms")
    @classmethod
    def _asymmetric_only(cls, algorithms: list[str]) -> list[str]:
        for name in algorithms:
            if name.lower() == "none" or name.upper().startswith("HS"):
                raise ValueError(f"{name} is refused: only asymmetric algorithms are accepted")
            if name not in ASYMMETRIC:
                raise ValueError(f"{name} is not one of {', '.join(ASYMMETRIC)}")
        return algorithms

    @property
    def keys_at(self) -> tuple[str, str]:
        """Where the key set comes from: ("jwks", url) or ("discovery", url)."""
        if self.jwks_url is not None:
            return ("jwks", self.jwks_url)
        default = self.issuer.rstrip("/") + "/.well-known/openid-configuration"
        return ("discovery", self.discovery_url or default)


@dataclass(frozen=True)
class ExternalUser:
    """Who a verified token names, in Parley's terms."""

    user_id: str
    display_name: str
    roles: tuple[str, ...]


def user_from_claims(claims: Mapping[str, Any], config: OidcConfig) -> ExternalUser:
    """The user the verified claims name; `TokenClaimsInvalid` when they cannot."""
    user_id = claim(claims, config.user_id_claim)
    if not isinstance(user_id, str) or not user_id:
        raise TokenClaimsInvalid(f"the token has no user id claim `{config.user_id_claim}`")
    if len(user_id) > MAX_USER_ID:
        raise TokenClaimsInvalid(f"the user id is longer than {MAX_USER_ID} characters")
    name = claim(claims, config.display_name_claim)
    display_name = name[:MAX_DISPLAY_NAME] if isinstance(name, str) and name else user_id
    roles: tuple[str, ...] = ()
    if config.roles_claim is not None:
        roles = _roles(claim(claims, config.roles_claim), config.roles_claim)
    return ExternalUser(user_id, display_name, roles)


def claim(claims: Mapping[str, Any], path: str) -> Any:
    """A claim by name, or by a dotted path when no claim has the whole name."""
    if path in claims:
        return claims[path]
    value: Any = claims
    for part in path.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    return value


def _roles(value: Any, name: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        value = value.split()
    if not isinstance(value, list) or not all(isinstance(role, str) for role in value):
        raise TokenClaimsInvalid(f"the roles claim `{name}` is not a list of strings")
    if len(value) > MAX_ROLES or any(len(role) > MAX_ROLE for role in value):
        raise TokenClaimsInvalid(f"the roles claim `{name}` holds too many or too long roles")
    return tuple(dict.fromkeys(value))


class Keys(Protocol):
    """Where the issuers' public keys come from (parley/jwks.py `KeySets`)."""

    async def key(self, config: OidcConfig, kid: str | None) -> PyJWK: ...


def unverified_issuer(token: str) -> str:
    """The `iss` the token claims, read before anything is verified: it only says which
    tenant's issuer to verify the token against."""
    try:
        claims = jwt.decode(token, options={"verify_signature": False})
    except jwt.DecodeError as exc:
        raise TokenMalformed(f"the bearer token is not a readable JWT ({exc})") from exc
    issuer = claims.get("iss")
    if not isinstance(issuer, str) or not issuer:
        raise TokenUnknownIssuer("the token names no issuer (`iss`)")
    return issuer


# The key type each algorithm family signs with (a JWK's `kty`).
_KEY_TYPE = {"RS": "RSA", "PS": "RSA", "ES": "EC", "Ed": "OKP"}


async def verify(token: str, config: OidcConfig, keys: Keys) -> dict[str, Any]:
    """The token's claims once its signature, issuer, audience and times check out against
    the tenant's config; otherwise the `TokenRefused` that says why.

    The algorithm is the tenant's choice, never the token's: a header naming another one
    (`none`, HS256 "signed" with the public key) is refused before any key is looked at.
    Verifying an RS256 signature takes tens of microseconds, so it runs on the event loop.
    """
    try:
        header = jwt.get_unverified_header(token)
    except jwt.DecodeError as exc:
        raise TokenMalformed(f"the bearer token is not a readable JWT ({exc})") from exc
    algorithm = header.get("alg")
    if not isinstance(algorithm, str) or algorithm not in config.algorithms:
        accepted = ", ".join(config.algorithms)
        raise TokenAlgorithmRefused(f"algorithm {algorithm!r} is refused (accepted: {accepted})")
    kid = header.get("kid")
    key = await keys.key(config, kid if isinstance(kid, str) else None)
    if key.key_type != _KEY_TYPE.get(algorithm[:2]):
        raise TokenBadSignature(f"key {key.key_id!r} is a {key.key_type} key, not for {algorithm}")
    try:
        return jwt.decode(
            token,
            key.key,
            algorithms=[algorithm],
            audience=config.audience,
            issuer=config.issuer,
            leeway=config.clock_skew_s,
            options={"require": ["exp", "iss", "aud"]},
        )
    except jwt.ExpiredSignatureError as exc:
        raise TokenExpired("the token has expired") from exc
    except jwt.ImmatureSignatureError as exc:
        raise TokenNotYetValid("the token is not valid yet (`nbf` or `iat`)") from exc
    except jwt.InvalidAudienceError as exc:
        raise TokenWrongAudience(f"the token is not for audience {config.audience!r}") from exc
    except jwt.InvalidIssuerError as exc:
        raise TokenUnknownIssuer("the token's issuer is not the tenant's") from exc
    except jwt.InvalidSignatureError as exc:
        raise TokenBadSignature("the token's signature does not verify") from exc
    except jwt.InvalidAlgorithmError as exc:
        raise TokenAlgorithmRefused(str(exc)) from exc
    except jwt.MissingRequiredClaimError as exc:
        raise TokenClaimsInvalid(str(exc)) from exc
    except jwt.DecodeError as exc:
        raise TokenMalformed(f"the bearer token is not a readable JWT ({exc})") from exc
    except jwt.InvalidTokenError as exc:  # a claim of the wrong type, say `iat`
        raise TokenClaimsInvalid(str(exc)) from exc


def looks_like_jwt(token: str) -> bool:
    """A compact JWS: three base64url parts, the first a JSON object (`eyJ` is `{"`)."""
    return token.startswith("eyJ") and token.count(".") == 2


class TokenRefused(Unauthenticated):
    code = "token_refused"


class TokenMalformed(TokenRefused):
    code = "token_malformed"


class TokenUnknownIssuer(TokenRefused):
    code = "token_unknown_issuer"


class TokenAlgorithmRefused(TokenRefused):
    code = "token_algorithm_refused"


class TokenUnknownKey(TokenRefused):
    code = "token_unknown_key"


class TokenBadSignature(TokenRefused):
    code = "token_bad_signature"


class TokenExpired(TokenRefused):
    code = "token_expired"


class TokenNotYetValid(TokenRefused):
    code = "token_not_yet_valid"


class TokenWrongAudience(TokenRefused):
    code = "token_wrong_audience"


class TokenClaimsInvalid(TokenRefused):
    code = "token_claims_invalid"
