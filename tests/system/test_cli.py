"""The operator CLI against the real database."""

from __future__ import annotations

import subprocess
import sys
from datetime import timedelta

import httpx
from sqlalchemy import update
from sqlalchemy.dialects.postgresql import insert

from parley.config import Settings
from parley.store.db import create_engine
from parley.store.identity import hash_token
from parley.store.models import ApiToken, User
from tests.support.stack import REPO, service_env


def parley(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "parley.launch.cli", *args],
        env=service_env(settings),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )


async def test_token_create_prints_a_token_that_authenticates(
    settings: Settings, api_url: str
) -> None:
    result = parley(settings, "token", "create", "--tenant", "northwind", "--user", "cust_3301")
    assert result.returncode == 0, result.stderr
    token = result.stdout.strip()
    assert token.startswith("pk_")
    async with httpx.AsyncClient(base_url=api_url) as http:
        response = await http.post("/v1/sessions", headers={"Authorization": f"Bearer {token}"})
    assert response.status_code == 201


def test_token_create_for_an_unknown_user_fails_clearly(settings: Settings) -> None:
    result = parley(settings, "token", "create", "--tenant", "northwind", "--user", "nobody")
    assert result.returncode != 0
    assert "unknown user" in result.stderr


def test_migrate_is_idempotent(settings: Settings) -> None:
    assert parley(settings, "migrate").returncode == 0
    assert parley(settings, "migrate").returncode == 0


async def test_token_revoke_refuses_the_token_from_the_next_request(
    settings: Settings, api_url: str
) -> None:
    created = parley(settings, "token", "create", "--tenant", "northwind", "--user", "cust_3301")
    token = created.stdout.strip()
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=api_url, headers=headers) as http:
        assert (await http.get("/v1/sessions")).status_code == 200
        revoked = parley(settings, "token", "revoke", token)
        assert revoked.returncode == 0, revoked.stderr
        assert (await http.get("/v1/sessions")).status_code == 401
    again = parley(settings, "token", "revoke", token)
    assert again.returncode != 0 and "no such live token" in again.stderr


async def test_token_revoke_for_a_user_revokes_all_their_tokens(
    settings: Settings, api_url: str, tokens: dict[str, str]
) -> None:
    # A user of the test's own: the shared fixtures' tokens must survive.
    engine = create_engine(settings.database_url or "")
    async with engine.begin() as conn:
        await conn.execute(
            insert(User)
            .values(tenant_id="southwind", id="cust_leaver", display_name="Leaver")
            .on_conflict_do_nothing()
        )
    await engine.dispose()
    minted = [
        parley(settings, "token", "create", "--tenant", "southwind", "--user", "cust_leaver")
        for _ in range(2)
    ]
    result = parley(settings, "token", "revoke", "--tenant", "southwind", "--user", "cust_leaver")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "revoked 2 token(s)"
    async with httpx.AsyncClient(base_url=api_url) as http:
        for created in minted:
            headers = {"Authorization": f"Bearer {created.stdout.strip()}"}
            assert (await http.get("/v1/sessions", headers=headers)).status_code == 401
        # Another user of the same tenant keeps their token.
        headers = {"Authorization": f"Bearer {tokens['ines']}"}
        assert (await http.get("/v1/sessions", headers=headers)).status_code == 200


async def test_token_create_with_a_ttl_expires(settings: Settings, api_url: str) -> None:
    result = parley(
        settings, "token", "create", "--tenant", "northwind", "--user", "cust_3301", "--ttl", "1h"
    )
    assert result.returncode == 0, result.stderr
    token = result.stdout.strip()
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=api_url, headers=headers) as http:
        assert (await http.get("/v1/sessions")).status_code == 200
        # The hour passes: the stored expiry is moved back rather than waited for.
        engine = create_engine(settings.database_url or "")
        async with engine.begin() as conn:
            moved = await conn.execute(
                update(ApiToken)
                .where(ApiToken.token_hash == hash_token(token))
                .values(expires_at=ApiToken.expires_at - timedelta(hours=1, seconds=1))
            )
            assert moved.rowcount == 1
        await engine.dispose()
        assert (await http.get("/v1/sessions")).status_code == 401
    refused = parley(
        settings, "token", "create", "--tenant", "northwind", "--user", "cust_3301", "--ttl", "0"
    )
    assert refused.returncode != 0 and "not a duration" in refused.stderr
