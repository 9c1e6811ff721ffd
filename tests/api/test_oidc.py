"""Sign-in through a tenant's own identity provider (parley/oidc.py), against a local issuer
each test starts (tests/support/issuer.py: its own key pairs, a discovery document and a
JWKS URL over real HTTP): a valid token is a user, made once; every other token is a 401
with a code that says why, and makes nothing; rotated keys are picked up without a restart,
and a key set that cannot be fetched fails closed for keys not already held."""

from __future__ import annotations

import asyncio
import os
import re
import sys
import time
from asyncio.subprocess import PIPE
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from sqlalchemy import func, select

from parley.config import Settings
from parley.jwks import KeySets
from parley.store import tenants
from parley.store.db import Database
from parley.store.models import User
from parley.tenancy import TenantConfig
from tests.support.issuer import LocalIssuer, SigningKey, local_issuer
from tests.support.orm import orm
from tests.support.stack import REPO, SteppedClock, api_in_process
from tests.support.tenants import AdminTenant, new_admin_tenant


@pytest.fixture
async def issuer() -> AsyncIterator[LocalIssuer]:
    async with local_issuer() as running:
        yield running


async def signs_in_with(sessions: Database, tenant_id: str, oidc: dict[str, Any]) -> None:
    """The tenant's config names the issuer (set in the store: the route's egress rules
    refuse a loopback address, tested below)."""
    async with sessions() as db:
        config = TenantConfig.model_validate({"oidc": oidc})
        await tenants.set_config(db, tenant_id=tenant_id, config=config)
        await db.commit()


@pytest.fixture
async def tenant(sessions: Database, issuer: LocalIssuer) -> AdminTenant:
    made = await new_admin_tenant(sessions, prefix="oidc")
    await signs_in_with(sessions, made.tenant_id, issuer.config())
    return made


async def users_of(sessions: Database, tenant_id: str) -> dict[str, tuple[str, list[str]]]:
    async with orm(sessions) as db:
        rows = await db.execute(
            select(User.id, User.display_name, User.roles, User.issuer).where(
                User.tenant_id == tenant_id
            )
        )
        return {row.id: (row.display_name, row.roles, row.issuer) for row in rows}


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def test_a_valid_token_is_a_user_made_once_with_the_claims_roles(
    api_url: str, sessions: Database, issuer: LocalIssuer, tenant: AdminTenant
) -> None:
    token = issuer.token("alice", name="Alice Liddell")
    async with httpx.AsyncClient(base_url=api_url, headers=bearer(token)) as alice:
        # Five first requests at once: one user row.
        answers = await asyncio.gather(*(alice.get("/v1/sessions") for _ in range(5)))
        assert [a.status_code for a in answers] == [200] * 5, answers[0].text
        made = await alice.post("/v1/sessions", json={})
        assert made.status_code == 201, made.text
        listed = (await alice.get("/v1/sessions")).json()
        assert made.json()["id"] in str(listed)
    users = await users_of(sessions, tenant.tenant_id)
    assert users["alice"] == ("Alice Liddell", [], issuer.issuer)
    assert len(users) == 2  # the operator and Alice, once

    # The roles are the token's, on every request: not stored ones, not the request's.
    config = f"/v1/admin/tenants/{tenant.tenant_id}/config"
    async with httpx.AsyncClient(base_url=api_url) as http:
        as_admin = await http.get(config, headers=bearer(issuer.token("bob", roles=["admin"])))
        assert as_admin.status_code == 200, as_admin.text
        assert as_admin.json()["config"]["oidc"]["issuer"] == issuer.issuer
        demoted = await http.get(config, headers=bearer(issuer.token("bob", roles=[])))
        assert demoted.status_code == 403
        # Another tenant's admin route: as for any resource not the caller's.
        elsewhere = await http.get(
            "/v1/admin/tenants/northwind/config",
            headers=bearer(issuer.token("bob", roles=["admin"])),
        )
        assert elsewhere.status_code == 404
    # The row follows the last token's claims (what an operator sees of the user).
    assert (await users_of(sessions, tenant.tenant_id))["bob"] == (
        "User bob",
        ["admin"],
        issuer.issuer,
    )


def refused_tokens(issuer: LocalIssuer, tenant: AdminTenant) -> dict[str, tuple[str, str]]:
    """name: (token, the code its 401 carries)."""
    now = int(time.time())
    stranger = SigningKey.rsa()
    return {
        "expired": (issuer.token("carol", exp=now - 3600, iat=now - 7200), "token_expired"),
        "not yet valid": (issuer.token("carol", nbf=now + 3600), "token_not_yet_valid"),
        "wrong audience": (
            issuer.token("carol", aud="https://other.example"),
            "token_wrong_audience",
        ),
        "wrong issuer": (
            issuer.token("carol", iss="https://idp.other.example"),
            "token_unknown_issuer",
        ),
        "unknown key": (issuer.token("carol", key=stranger), "token_unknown_key"),
        "alg none": (issuer.unsigned("carol"), "token_algorithm_refused"),
        "HMAC with the public key": (
            issuer.hmac_with_public_key("carol"),
            "token_algorithm_refused",
        ),
        "tampered payload": (issuer.tampered("carol", sub="dave"), "token_bad_signature"),
        "not a JWT": ("eyJhbGciOi.bm90IGpzb24.c2ln", "token_malformed"),
        "no subject": (issuer.token("", sub=None), "token_claims_invalid"),
        # The tenant's operator was made by Parley: the provider cannot choose to be them.
        "a Parley user's id": (issuer.token(tenant.admin_id), "token_claims_invalid"),
    }


async def test_each_refused_token_is_401_with_its_code_and_makes_nothing(
    api_url: str, sessions: Database, issuer: LocalIssuer, tenant: AdminTenant
) -> None:
    before = await users_of(sessions, tenant.tenant_id)
    async with httpx.AsyncClient(base_url=api_url) as http:
        for name, (token, code) in refused_tokens(issuer, tenant).items():
            refused = await http.post("/v1/sessions", json={}, headers=bearer(token))
            assert refused.status_code == 401, (name, refused.text)
            assert refused.json()["error"]["code"] == code, (name, refused.text)
            assert refused.headers["www-authenticate"] == "Bearer", name
    assert await users_of(sessions, tenant.tenant_id) == before
    async with orm(sessions) as db:
        strays = await db.scalar(select(func.count()).where(User.id.in_(["carol", "dave"])))
    assert strays == 0


async def test_rotated_keys_are_picked_up_and_a_key_set_that_is_down_fails_closed(
    settings: Any, sessions: Database, issuer: LocalIssuer, tenant: AdminTenant
) -> None:
    clock = SteppedClock()
    keys = KeySets(clock=clock, refetch_after_s=30, max_age_s=900)
    async with api_in_process(settings, tenant.token) as (app, client), keys:
        app.state.key_sets = keys  # the same key sets the app makes, on the test's clock
        async with httpx.AsyncClient(base_url=client.http.base_url) as http:

            async def status(token: str) -> tuple[int, str]:
                answer = await http.get("/v1/sessions", headers=bearer(token))
                return answer.status_code, answer.json().get("error", {}).get("code", "")

            first = issuer.keys[0]
            assert await status(issuer.token("erin")) == (200, "")
            assert issuer.served == {"discovery": 1, "jwks": 1}

            # The provider rotates: its next key is fetched once the rate limit allows.
            second = issuer.rotate(SigningKey.ec())
            assert await status(issuer.token("erin")) == (401, "token_unknown_key")
            clock.advance(30)
            assert await status(issuer.token("erin")) == (200, "")
            assert issuer.served["jwks"] == 2
            # The withdrawn key no longer signs in (not in the set fetched).
            assert await status(issuer.token("erin", key=first)) == (401, "token_unknown_key")

            # Made-up keys, many at once: at most one fetch per interval, each refused.
            clock.advance(30)
            made_up = [issuer.token("erin", key=SigningKey.ec()) for _ in range(6)]
            answers = await asyncio.gather(*(status(token) for token in made_up))
            assert answers == [(401, "token_unknown_key")] * 6
            assert issuer.served["jwks"] == 3

            # The key set goes down: the key held keeps working, even past its age...
            issuer.down = True
            clock.advance(900)
            assert await status(issuer.token("erin", key=second)) == (200, "")
            assert issuer.served["jwks"] == 4  # it tried
            # ...and a key it does not hold is refused (fail closed), also after the interval.
            clock.advance(30)
            assert await status(issuer.token("erin", key=SigningKey.ec())) == (
                401,
                "token_unknown_key",
            )
            assert issuer.served["jwks"] == 5

            # Back up: a new key is fetched when the interval allows.
            issuer.down = False
            third = issuer.rotate()
            clock.advance(30)
            assert await status(issuer.token("erin", key=third)) == (200, "")
    # One user throughout: the rotations changed the keys, not who the tokens name.
    assert (await users_of(sessions, tenant.tenant_id))["erin"] == ("User erin", [], issuer.issuer)


async def test_the_config_refuses_symmetric_algorithms_a_taken_issuer_and_a_private_address(
    api_url: str, sessions: Database, issuer: LocalIssuer, tenant: AdminTenant
) -> None:
    other = await new_admin_tenant(sessions, prefix="oidc")
    path = f"/v1/admin/tenants/{other.tenant_id}/config"
    async with httpx.AsyncClient(base_url=api_url, headers=bearer(other.token)) as http:
        for algorithm in ("HS256", "none"):
            oidc = issuer.config(issuer="https://idp.example", algorithms=[algorithm])
            refused = await http.put(path, json={"oidc": oidc})
            assert refused.status_code == 422, refused.text
            assert "only asymmetric algorithms" in refused.json()["error"]["message"]
        taken = await http.put(path, json={"oidc": issuer.config()})
        assert taken.status_code == 422 and taken.json()["error"]["field"] == "oidc.issuer"
        # A loopback identity provider is not on the default egress allow-list.
        loopback = issuer.config(issuer=f"{issuer.url}/other")
        refused = await http.put(path, json={"oidc": loopback})
        assert refused.status_code == 422, refused.text
        assert refused.json()["error"]["code"] == "url_not_allowed"
        assert refused.json()["error"]["field"] == "oidc.discovery_url"
    async with sessions() as db:
        assert (await tenants.tenant_config(db, tenant_id=other.tenant_id)).oidc is None


async def test_the_feature_page_example_runs_as_written(
    settings: Settings, sessions: Database, issuer: LocalIssuer
) -> None:
    page = (REPO / "docs" / "features" / "oidc.md").read_text()
    [example] = re.findall(r"```python\n(.*?)```", page, flags=re.S)
    operator = await new_admin_tenant(sessions, prefix="oidc")
    # A loopback provider is reachable only through an entry naming its host.
    allowed = settings.model_copy(update={"mcp_allowed_hosts": ["127.0.0.1"]})
    async with api_in_process(allowed, operator.token) as (_, client):
        env = os.environ | {
            "PARLEY_URL": str(client.http.base_url),
            "PARLEY_ADMIN_TOKEN": operator.token,
            "PARLEY_TENANT": operator.tenant_id,
            "OIDC_ISSUER": issuer.issuer,
            "USER_ACCESS_TOKEN": issuer.token("frank"),
            "OTHER_AUDIENCE_TOKEN": issuer.token("frank", aud="https://other.example"),
        }
        run = await asyncio.create_subprocess_exec(
            sys.executable, "-c", example, env=env, stdout=PIPE, stderr=PIPE
        )
        out, err = await asyncio.wait_for(run.communicate(), timeout=60)
    assert run.returncode == 0, err.decode()
    assert re.fullmatch(r"session ses_\w+\nrefused token_wrong_audience\n", out.decode())
    assert (await users_of(sessions, operator.tenant_id))["frank"][2] == issuer.issuer
