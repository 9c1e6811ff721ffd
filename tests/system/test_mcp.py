"""Tools from outside, end to end through the public API: tenant `northwind` configured with
the Northwind backend's real MCP server (streamable HTTP at `/mcp`), the demo model, real
Postgres and Temporal.

The store hours come from `get_store_hours` over a real MCP session; with the server down the
turn still ends `done`, with a `warning` and no hours of its own; every session a turn opens
is closed; the write tool runs only after the user's confirm, once; a tool the allow-list
does not name is never offered to the model nor run, even when the model asks for it.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest_asyncio
from sqlalchemy import select
from temporalio.client import Client

from parley.config import Settings
from parley.demo_backend.app import create_app as create_backend
from parley.gateway.base import Finish, ModelRequest, StreamEvent, ToolCallRequest
from parley.gateway.demo import DemoModel
from parley.launch.seeding import demo_mcp_server
from parley.store import tenants
from parley.store.db import Database
from parley.store.models import ModelCall, ToolCall, Turn
from parley.tenancy import TenantConfig
from tests.support.client import ParleyClient
from tests.support.orm import orm
from tests.support.stack import serve
from tests.support.toolkit import Stack, eventually, own_stack, reply

SEATTLE = "Mon-Sat 09:00-20:00, Sun 10:00-18:00"
NOT_ALLOWED = "northwind_mcp__export_customer_list"
# Anything that reads like a clock time: the outage answer must hold none.
CLOCK = re.compile(r"\b\d{1,2}:\d{2}\b|\b\d{1,2}\s?(am|pm)\b", re.IGNORECASE)


class ScriptedDemo(DemoModel):
    """The demo model, except that it asks for the tools queued in `force` first (a model
    naming a tool it was not offered), and remembers the tool names of every request."""

    def __init__(self) -> None:
        super().__init__(token_delay_s=0)
        self.force: list[str] = []
        self.offered: list[set[str]] = []

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
        self.offered.append({str(t["name"]) for t in request.tools})
        if self.force and request.messages[-1]["role"] == "user":
            name = self.force.pop(0)
            yield ToolCallRequest(f"call_forced_{len(self.offered)}", name, "{}")
            yield Finish("tool_calls", {"input_tokens": 1, "output_tokens": 1})
            return
        async for event in super().stream(request):
            yield event


@pytest_asyncio.fixture(scope="module")
async def backend() -> AsyncIterator[tuple[str, httpx.AsyncClient]]:
    """A Northwind backend of this module's own (its MCP figures are this module's alone)."""
    async with serve(create_backend()) as url, httpx.AsyncClient(base_url=url) as client:
        yield url, client


class Recorder:
    """An HTTP server that writes down every request it gets and answers 404."""

    def __init__(self) -> None:
        self.requests: list[str] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        self.requests.append(f"{scope['method']} {scope['path']}")
        await send({"type": "http.response.start", "status": 404, "headers": []})
        await send({"type": "http.response.body", "body": b""})


def redirecting_to(location: str) -> Any:
    """An HTTP server that answers every request with a 307 to `location`."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        headers = [(b"location", location.encode())]
        await send({"type": "http.response.start", "status": 307, "headers": headers})
        await send({"type": "http.response.body", "body": b""})

    return app


@dataclass
class Redirect:
    """An MCP URL whose server redirects to another local port, and what that port received."""

    url: str
    target: str
    recorder: Recorder


@pytest_asyncio.fixture(scope="module")
async def redirect() -> AsyncIterator[Redirect]:
    recorder = Recorder()
    async with serve(recorder) as second, serve(redirecting_to(f"{second}/mcp")) as first:
        yield Redirect(f"{first}/mcp", f"{second}/mcp", recorder)


def listed(*urls: str) -> list[str]:
    """The deployment's allow-list: public hosts, and these loopback servers by host:port."""
    return ["*", *(url.split("://", 1)[1].split("/", 1)[0] for url in urls)]


@pytest_asyncio.fixture(scope="module")
async def stack(
    settings: Settings,
    temporal_client: Client,
    sessions: Database,
    backend: tuple[str, httpx.AsyncClient],
    redirect: Redirect,
) -> AsyncIterator[Stack[ScriptedDemo]]:
    """Tenant `northwind` with the backend's MCP server, as the demo seed configures it; the
    tenant's configuration is put back afterwards. The deployment lists the backend (on
    loopback, refused unless listed) and both servers of the redirect."""
    url, _ = backend
    allowed = listed(url, redirect.url, redirect.target)
    async with sessions() as db:
        before = await tenants.tenant_config(db, tenant_id="northwind")
        config = before.model_copy(update={"mcp_servers": [demo_mcp_server(url)]})
        await tenants.set_config(db, tenant_id="northwind", config=config)
        await db.commit()
    try:
        async with own_stack(
            temporal_client,
            settings,
            sessions,
            ScriptedDemo(),
            prefix="mcp",
            northwind_url=url,
            mcp_allowed_hosts=allowed,
        ) as running:
            yield running
    finally:
        async with sessions() as db:
            await tenants.set_config(db, tenant_id="northwind", config=before)
            await db.commit()


@pytest_asyncio.fixture
async def priya(stack: Stack[ScriptedDemo], tokens: dict[str, str]) -> AsyncIterator[ParleyClient]:
    client = ParleyClient(stack.url, tokens["priya"])
    yield client
    await client.aclose()


@pytest_asyncio.fixture
async def northwind(backend: tuple[str, httpx.AsyncClient]) -> AsyncIterator[httpx.AsyncClient]:
    client = backend[1]
    yield client
    await client.delete("/faults")


async def mcp_stats(northwind: httpx.AsyncClient) -> dict[str, Any]:
    response = await northwind.get("/mcp/stats")
    assert response.status_code == 200, response.text
    return dict(response.json())


async def sessions_closed(northwind: httpx.AsyncClient) -> dict[str, Any]:
    """The server's figures once it has seen as many closes as opens (after a turn)."""

    async def balanced() -> dict[str, Any] | None:
        stats = await mcp_stats(northwind)
        return stats if stats["opens"] == stats["closes"] else None

    return await eventually(balanced, timeout=30, what="every MCP session closed")


async def offered_tools(db_sessions: Database, sid: str) -> list[set[str]]:
    """The tool names of every stored model request of a session."""
    async with orm(db_sessions) as db:
        requests = await db.scalars(
            select(ModelCall.request)
            .join(Turn, Turn.id == ModelCall.turn_id)
            .where(Turn.session_id == sid)
        )
        return [{t["name"] for t in r.get("tools", [])} for r in requests if "tools" in r]


async def test_store_hours_come_from_the_mcp_server(
    priya: ParleyClient,
    northwind: httpx.AsyncClient,
    sessions: Database,
) -> None:
    before = await sessions_closed(northwind)
    sid = await priya.new_session()
    _, events = await priya.turn(sid, "What are your store hours in Seattle?")
    answer = reply(events)
    assert SEATTLE in answer
    calls = [
        (c["name"], c["arguments"])
        for m in await priya.messages(sid)
        for c in m.get("tool_calls") or []
    ]
    assert calls == [("northwind_mcp__get_store_hours", {"city": "Seattle"})]
    after = await sessions_closed(northwind)
    assert after["calls"]["get_store_hours"] == before["calls"].get("get_store_hours", 0) + 1
    # Listed once for the turn (its later steps offer what it listed), one more session for
    # the call: all of them closed again.
    assert after["opens"] >= before["opens"] + 2
    offered = await offered_tools(sessions, sid)
    assert offered and all("northwind_mcp__get_store_hours" in names for names in offered)
    assert all("get_order" in names for names in offered)  # beside the local tools


async def test_an_mcp_outage_degrades_to_local_tools_with_a_warning(
    priya: ParleyClient,
    northwind: httpx.AsyncClient,
    sessions: Database,
) -> None:
    assert (await northwind.post("/faults", json={"mcp_outage": True})).status_code == 200
    before = await mcp_stats(northwind)
    sid = await priya.new_session()
    _, events = await priya.turn(sid, "What are your store hours in Seattle?")
    answer = reply(events)
    warnings = [e.data for e in events if e.type == "warning"]
    assert [w["code"] for w in warnings] == ["mcp_unavailable"]
    assert "can't look up our store hours" in answer
    assert not CLOCK.search(answer), answer
    offered = await offered_tools(sessions, sid)
    assert offered and not any(n.startswith("northwind_mcp__") for ns in offered for n in ns)
    assert all("get_order" in names for names in offered)
    after = await sessions_closed(northwind)
    assert after["calls"] == before["calls"]  # nothing reached a tool


async def test_the_write_tool_runs_only_after_the_confirm_and_once(
    priya: ParleyClient,
    northwind: httpx.AsyncClient,
) -> None:
    sid = await priya.new_session()
    posted = await priya.post(sid, "Please reserve NW-TNT-301 for pickup in Seattle.")
    assert posted.status_code == 202, posted.text
    turn_id = posted.json()["turn_id"]
    events = await priya.events(sid, turn_id)
    assert events[-1].type == "confirmation_required", [e.type for e in events]
    action = events[-1].data["action"]
    assert "NW-TNT-301" in action["summary"] and "Seattle" in action["summary"]
    stats = await sessions_closed(northwind)
    mine = [r for r in stats["reservations"] if r["idempotency_key"].endswith(action["id"])]
    assert mine == [] and stats["calls"].get("reserve_in_store_pickup", 0) == 0

    confirm = f"/v1/sessions/{sid}/actions/{action['id']}/confirm"
    assert (await priya.http.post(confirm)).status_code == 202
    rest = await priya.events(sid, turn_id, last_event_id=events[-1].id)
    answer = reply(rest)
    again = await priya.http.post(confirm)  # a second confirm runs nothing more
    assert again.status_code == 409 and again.json()["error"]["code"] == "action_resolved"
    stats = await sessions_closed(northwind)
    mine = [r for r in stats["reservations"] if r["idempotency_key"].endswith(action["id"])]
    assert len(mine) == 1, stats["reservations"]
    assert mine[0]["product_id"] == "NW-TNT-301" and mine[0]["city"] == "Seattle"
    assert mine[0]["customer"] == "cust_2291"  # the session's user, not the model's say
    assert stats["calls"]["reserve_in_store_pickup"] == 1
    assert answer.startswith("Done:") and mine[0]["reservation_id"] in answer


async def test_a_declined_write_never_reaches_the_server(
    priya: ParleyClient,
    northwind: httpx.AsyncClient,
) -> None:
    before = await mcp_stats(northwind)
    sid = await priya.new_session()
    posted = await priya.post(sid, "Please reserve NW-MUG-018 for pickup in Portland.")
    turn_id = posted.json()["turn_id"]
    events = await priya.events(sid, turn_id)
    action = events[-1].data["action"]
    decline = f"/v1/sessions/{sid}/actions/{action['id']}/decline"
    assert (await priya.http.post(decline)).status_code == 202
    reply(await priya.events(sid, turn_id, last_event_id=events[-1].id))
    after = await sessions_closed(northwind)
    assert len(after["reservations"]) == len(before["reservations"])
    assert after["calls"].get("reserve_in_store_pickup", 0) == before["calls"].get(
        "reserve_in_store_pickup", 0
    )


async def test_a_tool_outside_the_allow_list_is_never_offered_nor_run(
    priya: ParleyClient,
    northwind: httpx.AsyncClient,
    stack: Stack[ScriptedDemo],
    sessions: Database,
) -> None:
    # The server does serve it: it is the tenant's allow-list that leaves it out.
    before = await mcp_stats(northwind)
    stack.model.force.append(NOT_ALLOWED)
    sid = await priya.new_session()
    _, events = await priya.turn(sid, "Give me the list of all customers.")
    reply(events)
    async with orm(sessions) as db:
        [call] = await db.scalars(
            select(ToolCall).join(Turn, Turn.id == ToolCall.turn_id).where(Turn.session_id == sid)
        )
    assert call.name == NOT_ALLOWED and call.status == "error"
    assert call.result is not None and call.result["error"]["code"] == "not_allowed"
    offered = await offered_tools(sessions, sid)
    assert offered and all(NOT_ALLOWED not in names for names in offered)
    assert all("northwind_mcp__get_store_hours" in names for names in offered)
    assert not any(NOT_ALLOWED in names for names in stack.model.offered)
    after = await sessions_closed(northwind)
    assert after["calls"].get("export_customer_list", 0) == 0
    assert after["calls"] == before["calls"]
    assert json.dumps(after).count("a list no assistant should ever see") == 0


async def test_tenant_config_refuses_a_token_from_any_other_variable() -> None:
    # Credentials come from the environment under PARLEY_MCP_* only, never from the model.
    good = {"name": "x", "url": "http://h/mcp", "token_env": "PARLEY_MCP_X"}
    assert TenantConfig.model_validate({"mcp_servers": [good]}).mcp_servers
    for env in ("DATABASE_URL", "OPENAI_API_KEY"):
        bad = {**good, "token_env": env}
        try:
            TenantConfig.model_validate({"mcp_servers": [bad]})
        except ValueError:
            continue
        raise AssertionError(f"{env} accepted as a token variable")


async def test_a_rejected_credential_degrades_like_an_outage(
    stack: Stack[ScriptedDemo],
    tokens: dict[str, str],
    northwind: httpx.AsyncClient,
) -> None:
    # The server checks who is asking: the operator is no Northwind customer, so it refuses.
    operator = ParleyClient(stack.url, tokens["admin"])
    try:
        sid = await operator.new_session()
        _, events = await operator.turn(sid, "What are your store hours in Seattle?")
    finally:
        await operator.aclose()
    answer = reply(events)
    assert [e.data["code"] for e in events if e.type == "warning"] == ["mcp_unavailable"]
    assert not CLOCK.search(answer), answer
    await sessions_closed(northwind)


async def test_a_call_that_fails_is_a_prefixed_error_not_a_fact(
    priya: ParleyClient,
    northwind: httpx.AsyncClient,
    stack: Stack[ScriptedDemo],
    sessions: Database,
) -> None:
    # The server goes down between the listing and the call (the model asks for the tool
    # although this step's listing could not offer it).
    assert (await northwind.post("/faults", json={"mcp_outage": True})).status_code == 200
    stack.model.force.append("northwind_mcp__get_store_hours")
    sid = await priya.new_session()
    _, events = await priya.turn(sid, "What are your store hours in Seattle?")
    answer = reply(events)
    async with orm(sessions) as db:
        [call] = await db.scalars(
            select(ToolCall).join(Turn, Turn.id == ToolCall.turn_id).where(Turn.session_id == sid)
        )
    assert call.status == "error" and call.result is not None
    error = call.result["error"]
    assert error["code"] == "server_unavailable"
    assert error["message"].startswith("TOOL ERROR (not an answer")
    assert "can't look up our store hours" in answer and not CLOCK.search(answer)
    assert [e.data["code"] for e in events if e.type == "warning"] == ["mcp_unavailable"]


async def test_an_mcp_server_on_an_internal_address_is_refused_when_the_config_is_saved(
    stack: Stack[ScriptedDemo], tokens: dict[str, str], backend: tuple[str, httpx.AsyncClient]
) -> None:
    admin = ParleyClient(stack.url, tokens["admin"])
    config = "/v1/admin/tenants/northwind/config"
    try:
        before = (await admin.http.get(config)).json()["config"]
        for url in (
            "http://10.20.30.40/mcp",  # a private range
            "http://169.254.169.254/latest",  # link-local: the cloud's metadata service
            "http://127.0.0.1:5432/mcp",  # loopback, a port the deployment does not list
            "http://localhost:8100/mcp",  # a name is resolved and its address checked
        ):
            server = {"name": "elsewhere", "url": url, "allowed_tools": ["get_store_hours"]}
            refused = await admin.http.put(config, json={**before, "mcp_servers": [server]})
            assert refused.status_code == 422, (url, refused.text)
            error = refused.json()["error"]
            assert error["code"] == "url_not_allowed" and error["rule"] == "private_address"
            assert error["field"] == "mcp_servers.0.url"
            assert "private_address" in error["message"]
        # Nothing was saved; the listed backend's own server is accepted.
        assert (await admin.http.get(config)).json()["config"] == before
        kept = await admin.http.put(config, json=before)
        assert kept.status_code == 200, kept.text
        assert backend[0] in json.dumps(kept.json()["config"]["mcp_servers"])
    finally:
        await admin.aclose()


async def test_a_redirect_to_another_host_is_refused_at_turn_time_and_never_followed(
    priya: ParleyClient,
    redirect: Redirect,
    sessions: Database,
) -> None:
    server = demo_mcp_server("http://unused").model_copy(update={"url": redirect.url})
    async with sessions() as db:
        before = await tenants.tenant_config(db, tenant_id="northwind")
        moved = before.model_copy(update={"mcp_servers": [server]})
        await tenants.set_config(db, tenant_id="northwind", config=moved)
        await db.commit()
    try:
        sid = await priya.new_session()
        _, events = await priya.turn(sid, "What are your store hours in Seattle?")
    finally:
        async with sessions() as db:
            await tenants.set_config(db, tenant_id="northwind", config=before)
            await db.commit()
    answer = reply(events)
    warnings = [e.data for e in events if e.type == "warning"]
    assert [w["code"] for w in warnings] == ["mcp_unavailable"], warnings
    assert "redirect_off_origin" in warnings[0]["message"]
    assert "can't look up our store hours" in answer and not CLOCK.search(answer)
    assert redirect.recorder.requests == []  # the second host heard nothing
