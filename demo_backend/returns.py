"""Returns at the demo backend: an order's returnable items, creating a return (one per
`Idempotency-Key`), and the list of every return created.

    GET  /v1/tenants/{tenant}/customers/{customer}/orders/{order_id}/items   order_items
    POST /v1/tenants/{tenant}/customers/{customer}/returns                   create_return
    GET  /returns                                                            (control)

The items are the order's own (`demo_backend/data.py`, the one record of them: order 8390's
are design.md's Trail Runner shoes and Wool socks), each named `<order>-<line>`; only a
delivered order has items to return. State lives on the app
(one `ReturnsDesk` per backend), created on first use, so the app assembly stays untouched.
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime
from typing import Annotated, Literal, Protocol

from fastapi import APIRouter, Depends, Header, Request
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException
from typing_extensions import TypedDict

from parley.demo_backend.data import Order


class ItemJSON(TypedDict):
    item_id: str
    name: str
    price: str
    currency: str


class ItemsJSON(TypedDict):
    order_id: str
    items: list[ItemJSON]


Reason = Literal["too_small", "too_large", "damaged", "changed_my_mind"]


class ReturnIn(BaseModel):
    order_id: str = Field(pattern=r"^\d{3,10}$")
    item_id: str = Field(min_length=1, max_length=40)
    reason: Reason


class ReturnJSON(TypedDict):
    rma_id: str
    order_id: str
    item_id: str
    reason: str
    idempotency_key: str
    created_at: str


class ReturnsJSON(TypedDict):
    returns: list[ReturnJSON]


class OrderBook(Protocol):
    """What returns read of the backend's state (the app's `Backend`)."""

    def order(self, tenant: str, customer_id: str, order_id: str) -> Order | None: ...


class ReturnsDesk:
    """Every return created, one per idempotency key, under one lock (like the ESP)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_key: dict[str, ReturnJSON] = {}

    def create(self, key: str, body: ReturnIn) -> tuple[ReturnJSON, bool]:
        """The return for `key`: created now (True), or the one made earlier (False)."""
        with self._lock:
            earlier = self._by_key.get(key)
            if earlier is not None:
                return earlier, False
            made: ReturnJSON = {
                "rma_id": f"RMA-{100001 + len(self._by_key)}",
                "order_id": body.order_id,
                "item_id": body.item_id,
                "reason": body.reason,
                "idempotency_key": key,
                "created_at": datetime.now(UTC).isoformat(),
            }
            self._by_key[key] = made
            return made, True

    def all(self) -> list[ReturnJSON]:
        with self._lock:
            return list(self._by_key.values())


_desk_lock = threading.Lock()


def _desk(request: Request) -> ReturnsDesk:
    with _desk_lock:
        desk = getattr(request.app.state, "returns", None)
        if desk is None:
            desk = request.app.state.returns = ReturnsDesk()
        return desk


def _book(request: Request) -> OrderBook:
    book: OrderBook = request.app.state.backend
    return book


Desk = Annotated[ReturnsDesk, Depends(_desk)]
Book = Annotated[OrderBook, Depends(_book)]

returns = APIRouter(tags=["returns"])
_CUSTOMER = "/v1/tenants/{tenant}/customers/{customer}"


def _items(book: OrderBook, tenant: str, customer: str, order_id: str) -> list[ItemJSON]:
    order = book.order(tenant, customer, order_id)
    if order is None:  # another customer's order answers exactly like a missing one
        raise HTTPException(404, "order not found")
    if order.status != "delivered":  # nothing has arrived to send back
        return []
    return [
        {
            "item_id": f"{order_id}-{line}",
            "name": item.name,
            "price": f"{item.price.amount:.2f}",
            "currency": item.price.currency,
        }
        for line, item in enumerate(order.items, start=1)
    ]


@returns.get(_CUSTOMER + "/orders/{order_id}/items")
async def order_items(tenant: str, customer: str, order_id: str, book: Book) -> ItemsJSON:
    """The order's returnable items, each with its id and price."""
    return {"order_id": order_id, "items": _items(book, tenant, customer, order_id)}


@returns.post(_CUSTOMER + "/returns", status_code=201)
async def create_return(
    tenant: str,
    customer: str,
    body: ReturnIn,
    book: Book,
    desk: Desk,
    idempotency_key: Annotated[str, Header(min_length=8, max_length=200)],
) -> ReturnJSON:
    """Create a return of one item (the label goes out by email); the same key again answers
    with the return it made the first time."""
    if body.item_id not in {i["item_id"] for i in _items(book, tenant, customer, body.order_id)}:
        raise HTTPException(404, "item not found")
    made, _ = desk.create(idempotency_key, body)
    return made


@returns.get("/returns")
async def list_returns(desk: Desk) -> ReturnsJSON:
    """Every return created (control: never faulted)."""
    return {"returns": desk.all()}
