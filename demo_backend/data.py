"""Records, wire shapes, seed data and the return rule of the Northwind demo backend.

The seed is design.md's running example (Priya's orders 8472 and 8390 and their refunds) plus
two customers who exist to prove isolation: Marco, of the same tenant, and Ines, of another one.

Records are frozen dataclasses so the service can hand them out without copying; the one field
tests change (an order's carrier note) is changed by replacing the record. `to_json` and its
siblings give the wire shape, typed with TypedDicts so the app's OpenAPI schema documents it.
Accepted emails are records too, though the seed has none.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, timedelta
from decimal import Decimal
from typing import Literal

# pydantic (which FastAPI uses to read return annotations) needs this TypedDict before 3.12.
from typing_extensions import TypedDict

OrderStatus = Literal["processing", "shipped", "delivered", "cancelled"]
RefundStatus = Literal["approved", "completed"]
RefundStage = Literal["settling", "settled"]
# Why a return is refused; the tool result names it so the model need not guess.
ReturnBlock = Literal["not_delivered", "window_closed"]

# The demo's "today" (design.md); the service's clock starts here and tests move it.
DEMO_TODAY = date(2026, 10, 28)
# Counted in days from delivery; the last day of the window still accepts a return.
RETURN_WINDOW_DAYS = 30


class MoneyJSON(TypedDict):
    amount: str
    currency: str


class ItemJSON(TypedDict):
    sku: str
    name: str
    qty: int
    price: MoneyJSON  # of one


class CustomerJSON(TypedDict):
    customer_id: str
    name: str
    email: str
    email_verified: bool


class OrderJSON(TypedDict):
    order_id: str
    status: OrderStatus
    items: list[ItemJSON]
    total: MoneyJSON
    shipped_on: str | None
    eta: str | None
    delivered_on: str | None
    carrier_note: str | None
    placed_on: str | None


class RefundJSON(TypedDict):
    refund_id: str
    order_id: str
    amount: MoneyJSON
    status: RefundStatus
    stage: RefundStage
    approved_on: str
    completed_on: str | None


class EligibilityJSON(TypedDict):
    order_id: str
    eligible: bool
    window_days: int
    delivered_on: str | None
    window_ends: str | None
    days_left: int | None
    reason: ReturnBlock | None


class OrderList(TypedDict):
    orders: list[OrderJSON]


class RefundList(TypedDict):
    refunds: list[RefundJSON]


class EmailAccepted(TypedDict):
    message_id: str
    status: Literal["accepted"]


class EmailStatus(EmailAccepted):
    accepted_at: str


class AttachmentJSON(TypedDict):
    filename: str
    content_type: str
    # The file's text (the demo exports CSV); the ESP stores it as given.
    content: str


def _iso(day: date | None) -> str | None:
    return day.isoformat() if day is not None else None


@dataclass(frozen=True)
class Money:
    # Decimal, not float: amounts are shown to customers and must print as "24.00".
    amount: Decimal
    currency: str = "USD"

    def to_json(self) -> MoneyJSON:
        return {"amount": f"{self.amount:.2f}", "currency": self.currency}


@dataclass(frozen=True)
class Item:
    """One line of an order, the one record of it every route reads (the order, the order
    list and the returnable items of `demo_backend/returns.py`)."""

    sku: str
    name: str
    price: Money  # of one
    qty: int = 1

    def to_json(self) -> ItemJSON:
        return {"sku": self.sku, "name": self.name, "qty": self.qty, "price": self.price.to_json()}


@dataclass(frozen=True)
class Customer:
    tenant: str
    customer_id: str
    name: str
    email: str
    # Every demo address is verified, so the email tool never has to handle the other case.
    email_verified: bool = True

    def to_json(self) -> CustomerJSON:
        return {
            "customer_id": self.customer_id,
            "name": self.name,
            "email": self.email,
            "email_verified": self.email_verified,
        }


@dataclass(frozen=True)
class Order:
    # tenant and customer_id scope every lookup; they are not part of the wire shape because
    # the caller already named them in the path.
    tenant: str
    customer_id: str
    order_id: str
    status: OrderStatus
    items: tuple[Item, ...]
    total: Money
    shipped_on: date | None = None
    eta: date | None = None
    delivered_on: date | None = None
    # Free text from the carrier. It reaches the model as tool output, which makes it the
    # natural place for tests to plant an injection attempt.
    carrier_note: str | None = None
    placed_on: date | None = None

    @property
    def is_open(self) -> bool:
        return self.status not in ("delivered", "cancelled")

    def to_json(self) -> OrderJSON:
        return {
            "order_id": self.order_id,
            "status": self.status,
            "items": [item.to_json() for item in self.items],
            "total": self.total.to_json(),
            "shipped_on": _iso(self.shipped_on),
            "eta": _iso(self.eta),
            "delivered_on": _iso(self.delivered_on),
            "carrier_note": self.carrier_note,
            "placed_on": _iso(self.placed_on),
        }


@dataclass(frozen=True)
class Refund:
    tenant: str
    customer_id: str
    refund_id: str
    order_id: str
    amount: Money
    status: RefundStatus
    stage: RefundStage
    approved_on: date
    completed_on: date | None = None

    def to_json(self) -> RefundJSON:
        return {
            "refund_id": self.refund_id,
            "order_id": self.order_id,
            "amount": self.amount.to_json(),
            "status": self.status,
            "stage": self.stage,
            "approved_on": self.approved_on.isoformat(),
            "completed_on": _iso(self.completed_on),
        }


@dataclass(frozen=True)
class Email:
    message_id: str
    idempotency_key: str
    tenant: str
    to: str
    subject: str
    body: str
    # ISO 8601, as the service answers it: the record is its own JSON (`EmailRecords`).
    accepted_at: str
    attachments: tuple[AttachmentJSON, ...] = ()

    def status_json(self) -> EmailStatus:
        return {
            "message_id": self.message_id,
            "status": "accepted",
            "accepted_at": self.accepted_at,
        }


class EmailRecords(TypedDict):
    emails: list[Email]


@dataclass(frozen=True)
class Catalog:
    customers: tuple[Customer, ...]
    # Newest first, the order in which the service lists them.
    orders: tuple[Order, ...]
    refunds: tuple[Refund, ...]


def return_eligibility(order: Order, today: date) -> EligibilityJSON:
    """Whether `order` can still be returned on `today`, and until when."""
    window_ends: date | None
    days_left: int | None
    reason: ReturnBlock | None
    if order.delivered_on is None:
        window_ends = None
        eligible, days_left, reason = False, None, "not_delivered"
    else:
        window_ends = order.delivered_on + timedelta(days=RETURN_WINDOW_DAYS)
        eligible = today <= window_ends
        days_left = max(0, (window_ends - today).days)
        reason = None if eligible else "window_closed"
    return {
        "order_id": order.order_id,
        "eligible": eligible,
        "window_days": RETURN_WINDOW_DAYS,
        "delivered_on": _iso(order.delivered_on),
        "window_ends": _iso(window_ends),
        "days_left": days_left,
        "reason": reason,
    }


def _usd(amount: str) -> Money:
    return Money(Decimal(amount), "USD")


# Dana's October (design.md): order, placed, total, status. Shipping dates follow the status.
DANA_OCTOBER: tuple[tuple[str, str, str, OrderStatus], ...] = (
    ("9090", "2026-10-06", "320.00", "delivered"),
    ("9093", "2026-10-09", "880.00", "delivered"),
    ("9097", "2026-10-13", "1120.00", "delivered"),
    ("9099", "2026-10-16", "45.00", "delivered"),
    ("9101", "2026-10-19", "230.00", "delivered"),
    ("9104", "2026-10-20", "740.00", "shipped"),
    ("9105", "2026-10-21", "99.90", "shipped"),
    ("9107", "2026-10-22", "1250.00", "processing"),
    ("9108", "2026-10-22", "480.00", "shipped"),
    ("9111", "2026-10-23", "515.50", "delivered"),
    ("9112", "2026-10-24", "60.00", "cancelled"),
    ("9114", "2026-10-25", "500.00", "shipped"),
    ("9118", "2026-10-27", "2100.00", "processing"),
)


def _dana_order(order_id: str, placed: str, total: str, status: OrderStatus) -> Order:
    placed_on = date.fromisoformat(placed)
    shipped = placed_on + timedelta(days=1) if status in ("shipped", "delivered") else None
    return Order(
        "northwind",
        "cust_4410",
        order_id,
        status,
        items=(Item("NW-BIZ-" + order_id, "Business order " + order_id, _usd(total)),),
        total=_usd(total),
        shipped_on=shipped,
        eta=shipped + timedelta(days=4) if status == "shipped" and shipped else None,
        delivered_on=shipped + timedelta(days=3) if status == "delivered" and shipped else None,
        placed_on=placed_on,
    )


SEED = Catalog(
    customers=(
        Customer("northwind", "cust_2291", "Priya", "priya@example.com"),
        Customer("northwind", "cust_3301", "Marco", "marco@example.com"),
        Customer("southwind", "cust_9001", "Ines", "ines@example.com"),
        # Dana's business account: the result-set conversation of design.md.
        Customer("northwind", "cust_4410", "Dana", "dana@example.com"),
    ),
    orders=(
        Order(
            "northwind",
            "cust_2291",
            "8472",
            "shipped",
            items=(
                Item("NW-JKT-114", "Ridgeline Rain Shell, M", _usd("65.00")),
                # Out of stock after shipping; its price is the refund R-5530.
                Item("NW-SCK-207", "Merino Trail Socks, 3-pack", _usd("24.00")),
            ),
            total=_usd("89.00"),
            shipped_on=date(2026, 10, 26),
            eta=date(2026, 10, 30),
        ),
        Order(
            "northwind",
            "cust_3301",
            "8555",
            "processing",
            items=(Item("NW-TNT-301", "Basecamp 2-Person Tent", _usd("249.00")),),
            total=_usd("249.00"),
        ),
        Order(
            "northwind",
            "cust_2291",
            "8390",
            "delivered",
            # design.md's third example: the items the Returns specialist offers (8390-1, 8390-2).
            items=(
                Item("NW-TRL-008", "Trail Runner shoes, size 8", _usd("89.00")),
                Item("NW-SCK-311", "Wool socks (3-pack)", _usd("18.00")),
            ),
            # R-5102 (USD 12.50) was a price adjustment on the shoes, not a return.
            total=_usd("107.00"),
            shipped_on=date(2026, 9, 29),
            delivered_on=date(2026, 10, 2),
        ),
        Order(
            "southwind",
            "cust_9001",
            "9100",
            "delivered",
            items=(
                Item("SW-WND-410", "Harbor Windbreaker, L", _usd("72.00")),
                Item("SW-CAP-022", "Deck Cap", _usd("12.00"), qty=2),
            ),
            total=_usd("96.00"),
            shipped_on=date(2026, 10, 17),
            delivered_on=date(2026, 10, 20),
        ),
        *(_dana_order(*row) for row in reversed(DANA_OCTOBER)),
    ),
    refunds=(
        Refund(
            "northwind",
            "cust_2291",
            "R-5530",
            "8472",
            _usd("24.00"),
            "approved",
            "settling",
            approved_on=date(2026, 10, 27),
        ),
        Refund(
            "northwind",
            "cust_2291",
            "R-5102",
            "8390",
            _usd("12.50"),
            "completed",
            "settled",
            approved_on=date(2026, 10, 5),
            completed_on=date(2026, 10, 8),
        ),
    ),
)
