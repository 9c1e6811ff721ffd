"""A local OpenID Connect issuer for the sign-in tests: its own key pairs, a discovery
document and a JWKS URL, served over real HTTP on a loopback port (tests/support/stack.py
`serve`), and a signer for the tokens it would issue.

A test rotates its keys (`rotate`), takes its key set down (`down`: the key set answers 503),
and counts what was fetched (`served`).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from jwt.algorithms import ECAlgorithm, RSAAlgorithm
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tests.support.stack import serve

AUDIENCE = "https://parley.example/api"


@dataclass
class SigningKey:
    kid: str
    algorithm: str
    private: Any

    @classmethod
    def rsa(cls, kid: str | None = None) -> SigningKey:
        private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        return cls(kid or f"rsa-{uuid.uuid4().hex[:8]}", "RS256", private)

    @classmethod
    def ec(cls, kid: str | None = None) -> SigningKey:
        return cls(
            kid or f"ec-{uuid.uuid4().hex[:8]}", "ES256", ec.generate_private_key(ec.SECP256R1())
        )

    def jwk(self) -> dict[str, Any]:
        kind = RSAAlgorithm if self.algorithm.startswith("RS") else ECAlgorithm
        public = json.loads(kind.to_jwk(self.private.public_key()))
        return public | {"kid": self.kid, "use": "sig", "alg": self.algorithm}

    def public_pem(self) -> bytes:
        return self.private.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )


@dataclass
class LocalIssuer:
    url: str = ""
    keys: list[SigningKey] = field(default_factory=lambda: [SigningKey.rsa()])
    down: bool = False
    served: dict[str, int] = field(default_factory=lambda: {"discovery": 0, "jwks": 0})

    @property
    def issuer(self) -> str:
        return self.url

    @property
    def jwks_url(self) -> str:
        return f"{self.url}/jwks"

    def config(self, **extra: Any) -> dict[str, Any]:
        """The tenant's `oidc` block for this issuer (through its discovery document)."""
        base = {"issuer": self.issuer, "audience": AUDIENCE, "roles_claim": "roles"}
        return base | {"algorithms": ["RS256", "ES256"]} | extra

    def rotate(self, new: SigningKey | None = None) -> SigningKey:
        """A new key signs from now on; the old one is withdrawn from the key set."""
        self.keys = [new or SigningKey.rsa()]
        return self.keys[0]

    def claims(self, subject: str, **extra: Any) -> dict[str, Any]:
        now = int(time.time())
        base = {"iss": self.issuer, "aud": AUDIENCE, "sub": subject, "iat": now, "exp": now + 600}
        return base | {"name": f"User {subject}"} | extra

    def token(self, subject: str, *, key: SigningKey | None = None, **extra: Any) -> str:
        key = key or self.keys[0]
        claims = self.claims(subject, **extra)
        return jwt.encode(claims, key.private, algorithm=key.algorithm, headers={"kid": key.kid})

    def unsigned(self, subject: str) -> str:
        """`alg: none`: no signature at all."""
        header = {"alg": "none", "typ": "JWT", "kid": self.keys[0].kid}
        return f"{_b64(header)}.{_b64(self.claims(subject))}."

    def hmac_with_public_key(self, subject: str) -> str:
        """HS256 "signed" with the issuer's public key as the HMAC secret: whoever holds the
        public key (everybody) could make it."""
        key = self.keys[0]
        signed = (
            f"{_b64({'alg': 'HS256', 'typ': 'JWT', 'kid': key.kid})}.{_b64(self.claims(subject))}"
        )
        mac = hmac.new(key.public_pem(), signed.encode(), hashlib.sha256).digest()
        return f"{signed}.{_b64url(mac)}"

    def tampered(self, subject: str, **changed: Any) -> str:
        """A valid token whose payload was changed after signing."""
        header, _, signature = self.token(subject).split(".")
        return f"{header}.{_b64(self.claims(subject, **changed))}.{signature}"

    def app(self) -> Starlette:
        async def discovery(_: Request) -> Response:
            self.served["discovery"] += 1
            return JSONResponse({"issuer": self.issuer, "jwks_uri": self.jwks_url})

        async def jwks(_: Request) -> Response:
            self.served["jwks"] += 1
            if self.down:
                return JSONResponse({"error": "down"}, status_code=503)
            return JSONResponse({"keys": [key.jwk() for key in self.keys]})

        return Starlette(
            routes=[
                Route("/.well-known/openid-configuration", discovery),
                Route("/jwks", jwks),
            ]
        )


@asynccontextmanager
async def local_issuer() -> AsyncIterator[LocalIssuer]:
    issuer = LocalIssuer()
    async with serve(issuer.app()) as url:
        issuer.url = url
        yield issuer


def _b64(value: dict[str, Any]) -> str:
    return _b64url(json.dumps(value, separators=(",", ":")).encode())


def _b64url(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()
