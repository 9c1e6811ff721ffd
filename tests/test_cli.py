"""The operator CLI against the real database."""

from __future__ import annotations

import subprocess
import sys

import httpx

from parley.config import Settings
from tests.conftest import REPO, service_env


def parley(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "launch.cli", *args],
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
