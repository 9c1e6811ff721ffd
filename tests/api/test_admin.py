"""Operator switches: pause/resume, per-tenant configuration, the daily cap."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest_asyncio
from sqlalchemy import select

from parley.store.db import Database
from parley.store.models import ModelCall, ToolCall
from tests.support.client import ParleyClient
from tests.support.orm import orm
from tests.support.tenants import new_admin_tenant

BASE = "/v1/admin/tenants"


@pytest_asyncio.fixture
async def admin(api_url: str, tokens: dict[str, str]) -> AsyncIterator[ParleyClient]:
    client = ParleyClient(api_url, tokens["admin"])
    yield client
    # Leave the shared tenant as the other tests expect it.
    await client.http.post(f"{BASE}/northwind/resume")
    await client.http.put(f"{BASE}/northwind/config", json={})
    await client.aclose()


async def test_only_an_admin_of_the_tenant_may_use_the_switches(
    admin: ParleyClient, priya: ParleyClient
) -> None:
    denied = await priya.http.post(f"{BASE}/northwind/pause")
    assert denied.status_code == 403 and denied.json()["error"]["code"] == "forbidden"
    other = await admin.http.post(f"{BASE}/southwind/pause")
    missing = await admin.http.post(f"{BASE}/nowhere/pause")
    assert other.status_code == missing.status_code == 404
    assert other.json() == missing.json()


async def test_pause_stops_new_messages_and_resume_restores_them(
    admin: ParleyClient, priya: ParleyClient
) -> None:
    sid = await priya.new_session()
    assert (await admin.http.post(f"{BASE}/northwind/pause")).json()["paused"] is True
    paused = await priya.post(sid, "Hello")
    assert paused.status_code == 403 and paused.json()["error"]["code"] == "agent_paused"
    assert await priya.messages(sid) == []
    assert (await admin.http.post(f"{BASE}/northwind/resume")).json()["paused"] is False
    _, events = await priya.turn(sid, "Hello")
    assert events[-1].type == "done"


async def test_config_is_validated(admin: ParleyClient) -> None:
    for body, field in (
        ({"tool_allowlist": ["drop_tables"]}, "tool_allowlist"),
        ({"model_provider": "skynet"}, "model_provider"),
        ({"daily_cap": -1}, "daily_cap"),
        ({"api_key": "sk-nope"}, "api_key"),  # credentials have no place here
    ):
        response = await admin.http.put(f"{BASE}/northwind/config", json=body)
        assert response.status_code == 422, body
        assert response.json()["error"]["field"] == field


async def test_model_persona_and_tool_allowlist_apply_to_the_next_turn(
    admin: ParleyClient, priya: ParleyClient, sessions: Database
) -> None:
    config = {
        "model_provider": "demo",
        "model": "demo-2",
        "persona": "Sign off as Northwind Support.",
        "tool_allowlist": ["list_open_orders", "get_order", "get_refund"],
    }
    saved = await admin.http.put(f"{BASE}/northwind/config", json=config)
    assert saved.status_code == 200 and saved.json()["config"] == config
    sid = await priya.new_session()
    turn_id, events = await priya.turn(sid, "Where is my order?")
    assert events[-1].type == "done"
    async with orm(sessions) as db:
        calls = list(await db.scalars(select(ModelCall).where(ModelCall.turn_id == turn_id)))
    assert {c.model for c in calls} == {"demo-2"}
    request = calls[0].request
    assert "Sign off as Northwind Support." in request["messages"][0]["content"]
    assert [t["name"] for t in request["tools"]] == config["tool_allowlist"]
    # A tool off the list is not offered, so the model does not ask for it (that the server
    # refuses one a provider asks for anyway: tests/system/test_answer_paths.py).
    turn_id, events = await priya.turn(sid, "Can you email me?")
    assert events[-1].type == "done"
    async with orm(sessions) as db:
        asked = list(await db.scalars(select(ToolCall.name).where(ToolCall.turn_id == turn_id)))
    assert "propose_email" not in asked
    assert not [e for e in events if e.type == "confirmation_required"]


async def test_the_daily_cap_answers_429_with_retry_after(
    admin: ParleyClient, priya: ParleyClient
) -> None:
    await admin.http.put(f"{BASE}/northwind/config", json={"daily_cap": 0})
    sid = await priya.new_session()
    capped = await priya.post(sid, "Hello")
    assert capped.status_code == 429
    assert capped.json()["error"]["code"] == "daily_cap_reached"
    assert int(capped.headers["Retry-After"]) > 0
    await admin.http.put(f"{BASE}/northwind/config", json={})
    assert (await priya.post(sid, "Hello")).status_code == 202


def _client(api_url: str, token: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=api_url, headers={"Authorization": f"Bearer {token}"})


async def test_config_takes_the_documented_types_only_and_keeps_what_it_had(
    api_url: str, sessions: Database
) -> None:
    """Found by the fuzz: `false` was stored as a day count of 0 (and `"5"` as a cap, `1` as
    a switch), a body the OpenAPI document says is invalid. Each is refused, naming its
    field, and the stored configuration stays as it was. A number without a fraction is an
    integer to JSON Schema, so `5.0` is a cap of 5."""
    tenant = await new_admin_tenant(sessions)
    async with _client(api_url, tenant.token) as admin:
        config = f"{BASE}/{tenant.tenant_id}/config"
        saved = await admin.put(
            config, json={"retention": {"memory_days": 30.0}, "daily_cap": 5.0, "summaries": True}
        )
        kept = {"retention": {"memory_days": 30}, "daily_cap": 5, "summaries": True}
        assert saved.status_code == 200 and saved.json()["config"] == kept
        for body, field in (
            ({"retention": {"memory_days": False}}, "retention.memory_days"),
            ({"daily_cap": "5"}, "daily_cap"),
            ({"daily_cap": 5.5}, "daily_cap"),
            ({"summaries": 1}, "summaries"),
            (
                {"mcp_servers": [{"name": "s", "url": "https://x", "timeout_s": True}]},
                "mcp_servers.0.timeout_s",
            ),
        ):
            refused = await admin.put(config, json=body)
            assert refused.status_code == 422, (body, refused.text)
            assert refused.json()["error"]["field"] == field
        stored = await admin.get(config)
        assert stored.status_code == 200 and stored.json()["config"] == kept


async def test_the_documented_tool_names_are_the_ones_config_accepts(
    api_url: str, sessions: Database
) -> None:
    """Found by the fuzz: the document allowed any string in `tool_allowlist`, and the route
    refused all but the local tools. It lists them now, and accepts every one it lists."""
    tenant = await new_admin_tenant(sessions)
    async with _client(api_url, tenant.token) as admin:
        document = (await admin.get("/openapi.json")).json()
        field = document["components"]["schemas"]["TenantConfig"]["properties"]["tool_allowlist"]
        [listed] = [part["items"]["enum"] for part in field["anyOf"] if part["type"] == "array"]
        config = f"{BASE}/{tenant.tenant_id}/config"
        saved = await admin.put(config, json={"tool_allowlist": listed})
        assert saved.status_code == 200, saved.text
        assert saved.json()["config"]["tool_allowlist"] == listed
        refused = await admin.put(config, json={"tool_allowlist": ["send_email"]})
        assert refused.status_code == 422
