"""The Northwind backend's Model Context Protocol server: store hours and the product catalog,
over streamable HTTP at `/mcp`, with stateful sessions (one `Mcp-Session-Id` each).

Tools:

    get_store_hours(city)                   read
    search_products(query)                  read
    reserve_in_store_pickup(product_id, city)  a write: one reservation per `Idempotency-Key`
    export_customer_list()                  served, but no tenant config allows it (tests)

Every request names its caller in headers (`X-Parley-Tenant`, `X-Parley-User`); a tenant or
customer the backend does not know is `401`. The `mcp_outage` fault answers `503` at once.
`GET /mcp/stats` reports sessions opened and closed (a `DELETE` that ended one), the calls
of each tool and the reservations made: tests check that every session a turn opens is
closed, and that a write ran once.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from mcp.server.mcpserver import Context, MCPServer
from starlette.routing import Route
from starlette.types import Message, Receive, Scope, Send

HOURS: dict[str, list[dict[str, str]]] = {
    "seattle": [
        {"days": "Mon-Sat", "open": "09:00", "close": "20:00"},
        {"days": "Sun", "open": "10:00", "close": "18:00"},
    ],
    "portland": [{"days": "Mon-Sun", "open": "10:00", "close": "19:00"}],
}

PRODUCTS: list[dict[str, Any]] = [
    {"product_id": "NW-JKT-114", "name": "Ridgeline Rain Shell", "price": "129.00"},
    {"product_id": "NW-SCK-207", "name": "Merino Trail Socks, 3-pack", "price": "18.00"},
    {"product_id": "NW-TNT-301", "name": "Basecamp 2-Person Tent", "price": "249.00"},
    {"product_id": "NW-FLC-052", "name": "Summit Fleece Pullover", "price": "69.00"},
    {"product_id": "NW-MUG-018", "name": "Enamel Camp Mug", "price": "14.00"},
    {"product_id": "NW-TRL-008", "name": "Trail Runner shoes", "price": "89.00"},
]


class McpState:
    """Sessions, calls and reservations, under one lock never held across an await."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.opens = 0
        self.closes = 0
        self.calls: Counter[str] = Counter()
        self.reservations: dict[str, dict[str, Any]] = {}  # by idempotency key

    def count(self, *, opened: int = 0, closed: int = 0, call: str | None = None) -> None:
        with self._lock:
            self.opens += opened
            self.closes += closed
            if call is not None:
                self.calls[call] += 1

    def reserve(self, key: str, product_id: str, city: str, user: str) -> dict[str, Any]:
        with self._lock:
            if key not in self.reservations:
                self.reservations[key] = {
                    "reservation_id": f"RSV-{len(self.reservations) + 1:05d}",
                    "product_id": product_id,
                    "city": city,
                    "customer": user,
                    "idempotency_key": key,
                    "created_at": datetime.now(UTC).isoformat(),
                }
            return self.reservations[key]

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {
                "opens": self.opens,
                "closes": self.closes,
                "calls": dict(self.calls),
                "reservations": list(self.reservations.values()),
            }


def _server(state: McpState) -> MCPServer:
    server = MCPServer("northwind", log_level="WARNING")

    @server.tool(description="Opening hours of the Northwind store in a city, by day.")
    def get_store_hours(city: str) -> str:
        state.count(call="get_store_hours")
        hours = HOURS.get(city.strip().lower())
        if hours is None:
            return json.dumps({"city": city, "found": False, "cities": ["Seattle", "Portland"]})
        return json.dumps({"city": city.strip().title(), "found": True, "hours": hours})

    @server.tool(description="Search the Northwind product catalog by words in the name.")
    def search_products(query: str) -> str:
        state.count(call="search_products")
        words = query.lower().split()
        found = [p for p in PRODUCTS if all(w in p["name"].lower() for w in words)]
        return json.dumps({"query": query, "products": found[:10]})

    @server.tool(description="Reserve a product for pickup in a store (a write).")
    def reserve_in_store_pickup(product_id: str, city: str, ctx: Context) -> str:
        state.count(call="reserve_in_store_pickup")
        headers = ctx.headers or {}
        key = headers.get("idempotency-key")
        if not key:
            raise ValueError("an Idempotency-Key header is required")
        if city.strip().lower() not in HOURS:
            raise ValueError(f"there is no store in {city}")
        if product_id not in {p["product_id"] for p in PRODUCTS}:
            raise ValueError(f"no product {product_id}")
        user = headers.get("x-parley-user", "")
        return json.dumps(state.reserve(key, product_id, city.strip().title(), user))

    @server.tool(description="Export every customer's name and address (staff only).")
    def export_customer_list() -> str:
        state.count(call="export_customer_list")
        return json.dumps({"customers": ["(a list no assistant should ever see)"]})

    return server


async def _answer(send: Send, status: int, code: str, message: str) -> None:
    body = json.dumps({"error": {"code": code, "message": message}}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class _Endpoint:
    """`/mcp`: the outage fault and the caller's identity first, then the SDK's session
    manager, counting the sessions it opens and the ones a `DELETE` closes."""

    def __init__(
        self, server: MCPServer, state: McpState, gate: Callable[[str, str], tuple[bool, bool]]
    ) -> None:
        self._server, self._state, self._gate = server, state, gate

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        outage, known = self._gate(
            headers.get("x-parley-tenant", ""), headers.get("x-parley-user", "")
        )
        if outage:
            await _answer(send, 503, "unavailable", "the tool server is down (injected outage)")
            return
        if not known:
            await _answer(send, 401, "unauthorized", "unknown tenant or customer")
            return
        opening = "mcp-session-id" not in headers

        async def counting(message: Message) -> None:
            if message["type"] == "http.response.start" and message["status"] < 300:
                if scope["method"] == "DELETE":
                    self._state.count(closed=1)
                elif opening and any(k.lower() == b"mcp-session-id" for k, _ in message["headers"]):
                    self._state.count(opened=1)
            await send(message)

        await self._server.session_manager.handle_request(scope, receive, counting)


def mount_mcp(app: FastAPI, gate: Callable[[str, str], tuple[bool, bool]]) -> McpState:
    """Serve the MCP server at `/mcp` and its figures at `/mcp/stats`. `gate(tenant, user)`
    says whether the outage fault is on and whether the caller is known."""
    state = McpState()
    server = _server(state)
    server.streamable_http_app()  # builds the session manager the endpoint hands requests to
    endpoint = _Endpoint(server, state, gate)
    app.router.routes.append(Route("/mcp", endpoint, methods=["GET", "POST", "DELETE"]))
    stats = APIRouter(tags=["control"])

    @stats.get("/mcp/stats")
    async def mcp_stats(request: Request) -> dict[str, Any]:
        """MCP sessions opened and closed, calls per tool, reservations made."""
        return state.stats()

    app.include_router(stats)
    outer = app.router.lifespan_context

    @asynccontextmanager
    async def lifespan(a: Any) -> AsyncIterator[Any]:
        async with server.session_manager.run(), outer(a) as inner:
            yield inner

    app.router.lifespan_context = lifespan
    return state
