"""MCP connections pinned to checked addresses (gateway/pinned.py), against a TCP listener of
this module's own on loopback, with a stand-in resolver (names below end in `.test`, which no
real resolver answers, so a connection that reaches the listener used the stand-in's answer).

A name that answers a public address to the check and loopback to the connection (DNS
rebinding; `localhost` here, so a second lookup by the system's resolver would reach the
listener) gets no connection at all; a host the allow-list names is reached at the address
its one lookup gave, tried in order, with the URL's name in `Host` and in TLS's SNI; every new
connection is looked up and checked again.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx2
import pytest
import pytest_asyncio

from parley.activities.mcp import mcp_session
from parley.egress import Allowlist, check_url
from parley.errors import UrlNotAllowed
from parley.gateway.pinned import pinned_transport
from parley.mcp import McpServerConfig

PUBLIC = "93.184.216.34"


class Listener:
    """A loopback TCP server that writes down the first bytes of every connection and, to a
    plain HTTP request, answers `200 ok` and closes."""

    def __init__(self) -> None:
        self.heard: list[bytes] = []
        self.arrived = asyncio.Condition()
        self.port = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        data = await reader.read(4096)
        async with self.arrived:
            self.heard.append(data)
            self.arrived.notify_all()
        if data.startswith(b"GET "):
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
            await writer.drain()
        writer.close()

    async def nothing_before(self) -> list[bytes]:
        """What it heard before a connection made now (awaited, not slept on)."""
        _, writer = await asyncio.open_connection("127.0.0.1", self.port)
        writer.write(b"sentinel")
        await writer.drain()
        async with self.arrived:
            await self.arrived.wait_for(lambda: b"sentinel" in self.heard)
        writer.close()
        return self.heard[: self.heard.index(b"sentinel")]


@pytest_asyncio.fixture
async def listener() -> AsyncIterator[Listener]:
    heard = Listener()
    server = await asyncio.start_server(heard.handle, "127.0.0.1", 0)
    heard.port = server.sockets[0].getsockname()[1]
    async with server:
        yield heard


class Answers:
    """A resolver that answers each lookup with the next list of addresses (the last one
    again once they run out), counting the lookups."""

    def __init__(self, *answers: list[str]) -> None:
        self.answers = list(answers)
        self.lookups = 0

    async def __call__(self, host: str, port: int) -> list[str]:
        self.lookups += 1
        return self.answers[min(self.lookups, len(self.answers)) - 1]


def client(allowed: list[str], resolve: Answers) -> httpx2.AsyncClient:
    transport = pinned_transport(Allowlist.parse(allowed), field="pinned", resolve=resolve)
    return httpx2.AsyncClient(transport=transport, trust_env=False)


async def test_a_name_that_rebinds_to_loopback_after_the_check_reaches_nothing(
    listener: Listener,
) -> None:
    # `localhost`: a client that looked the name up again would reach the listener.
    url = f"http://localhost:{listener.port}/mcp"
    rebinding = Answers([PUBLIC], ["127.0.0.1"])
    allowed = ["*"]
    await check_url(url, Allowlist.parse(allowed), field="pinned", resolve=rebinding)
    async with client(allowed, rebinding) as http:
        with pytest.raises(UrlNotAllowed) as refused:
            await http.get(url)
    assert refused.value.extra["rule"] == "private_address"
    assert "localhost resolves to 127.0.0.1, a loopback address" in refused.value.message
    assert rebinding.lookups == 2
    assert await listener.nothing_before() == []


async def test_a_named_host_is_reached_at_the_address_its_lookup_gave(listener: Listener) -> None:
    # 127.0.0.2 is loopback too, but nothing listens there: the next address is tried.
    named = Answers(["127.0.0.2", "127.0.0.1"])
    async with client([f"mcp.test:{listener.port}"], named) as http:
        first = await http.get(f"http://mcp.test:{listener.port}/mcp")
        second = await http.get(f"http://mcp.test:{listener.port}/mcp")
    assert (first.status_code, first.text, second.text) == (200, "ok", "ok")
    assert all(f"Host: mcp.test:{listener.port}".encode() in heard for heard in listener.heard)
    # The listener closes each connection: the second request's connection was looked up
    # (and checked) again.
    assert named.lookups == 2 and len(listener.heard) == 2


async def test_a_named_host_that_does_not_resolve_is_unreachable_not_refused() -> None:
    async with client(["gone.test"], Answers([])) as http:
        with pytest.raises(httpx2.ConnectError, match="gone.test does not resolve"):
            await http.get("http://gone.test/mcp")


async def test_tls_names_the_urls_host_not_the_address(listener: Listener) -> None:
    named = Answers(["127.0.0.1"])
    async with client([f"mcp.test:{listener.port}"], named) as http:
        # The listener speaks no TLS: the handshake fails after its ClientHello is sent.
        with pytest.raises(httpx2.TransportError):
            await http.get(f"https://mcp.test:{listener.port}/mcp")
    [hello] = listener.heard
    assert hello.startswith(b"\x16\x03")  # a TLS handshake record
    assert b"mcp.test" in hello and b"127.0.0.1" not in hello  # the SNI names the host


async def test_an_mcp_session_on_a_refused_address_sends_nothing(listener: Listener) -> None:
    server = McpServerConfig(
        name="elsewhere",
        url=f"http://127.0.0.1:{listener.port}/mcp",
        allowed_tools=["get_store_hours"],
    )
    with pytest.raises(UrlNotAllowed) as refused:
        async with mcp_session(server, tenant_id="t", user_id="u", allowed=Allowlist.parse(["*"])):
            pass
    assert refused.value.extra == {"field": "elsewhere", "rule": "private_address"}
    assert await listener.nothing_before() == []
