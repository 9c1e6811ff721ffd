"""The order search of the demo backend: one customer's orders filtered by placed date,
total and status (`GET /v1/tenants/{tenant}/customers/{customer}/order-search`).

Bounds are inclusive for dates and exclusive for the total ("over $500" leaves out 500.00).
Rows come oldest first, the order a person reads a statement in.
"""

from __future__ import annotations

from datetime import date
from decimal import Decimal
from typing import Annotated, Protocol

from fastapi import APIRouter, Depends, Query, Request
from starlette.exceptions import HTTPException
from typing_extensions import TypedDict

from parley.demo_backend.data import Customer, Order, OrderStatus


class OrderBook(Protocol):
    """What the search reads of the backend's state (the app's `Backend`)."""

    def customer(self, tenant: str, customer_id: str) -> Customer | None: ...

    def orders(self, tenant: str, customer_id: str) -> list[Order]: ...


def _book(request: Request) -> OrderBook:
    book: OrderBook = request.app.state.backend
    return book


class OrderRowJSON(TypedDict):
    order_id: str
    placed: str
    total: str
    currency: str
    status: OrderStatus


class OrderSearchJSON(TypedDict):
    orders: list[OrderRowJSON]


def _row(order: Order) -> OrderRowJSON:
    assert order.placed_on is not None
    return {
        "order_id": order.order_id,
        "placed": order.placed_on.isoformat(),
        "total": f"{order.total.amount:.2f}",
        "currency": order.total.currency,
        "status": order.status,
    }


def matches(
    order: Order,
    *,
    placed_from: date | None,
    placed_to: date | None,
    min_total: Decimal | None,
    status: OrderStatus | None,
) -> bool:
    placed = order.placed_on
    if placed is None:
        return placed_from is None and placed_to is None
    return (
        (placed_from is None or placed >= placed_from)
        and (placed_to is None or placed <= placed_to)
        and (min_total is None or order.total.amount > min_total)
        and (status is None or order.status == status)
    )


# The app includes this router behind its fault gate, counted as `search_orders`.
search = APIRouter(prefix="/v1/tenants/{tenant}/customers/{customer}", tags=["tools"])


@search.get("/order-search")
async def search_orders(
    tenant: str,
    customer: str,
    backend: Annotated[OrderBook, Depends(_book)],
    placed_from: date | None = None,
    placed_to: date | None = None,
    min_total: Annotated[Decimal | None, Query(ge=0)] = None,
    status: OrderStatus | None = None,
) -> OrderSearchJSON:
    """The customer's orders placed in a date range, over a total, with a status; oldest first."""
    if backend.customer(tenant, customer) is None:
        raise HTTPException(404, "customer not found")  # the app's not-found answer
    found = [
        o
        for o in backend.orders(tenant, customer)
        if o.placed_on is not None
        and matches(
            o, placed_from=placed_from, placed_to=placed_to, min_total=min_total, status=status
        )
    ]
    found.sort(key=lambda o: (o.placed_on or date.min, o.order_id))
    return {"orders": [_row(o) for o in found]}
