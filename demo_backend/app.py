"""The Northwind demo backend as a FastAPI app: order/refund lookups, an email service, and knobs.

Parley's tool executor calls it over real HTTP, so timeouts, outages and idempotency keys are
real rather than mocked. State lives in memory, one `Backend` per app, and everything is
deterministic: fixed seed data, a settable clock, and a seeded random source for injected errors.

Tool-facing (identity in the path; every lookup is scoped to tenant *and* customer, and another
customer's order answers exactly like a missing one)::

    GET  /v1/tenants/{tenant}/customers/{customer}                       get_customer
    GET  .../orders?status=open|all                                       list_orders
    GET  .../orders/{order_id}                                            get_order
    GET  .../orders/{order_id}/refund                                     get_refund
    GET  .../orders/{order_id}/return-eligibility                         return_eligibility
    GET  .../refunds                                                      list_refunds
    GET  .../order-search?placed_from&placed_to&min_total&status         search_orders

Email service (ESP), idempotent per `Idempotency-Key`: `POST /v1/emails` (send_email, keeps the
`attachments`), `GET /v1/emails/by-key/{key}`. `/mcp`: mcp_server.py; returns: returns.py. Control
(never faulted or counted): `GET /emails`, `GET|POST|DELETE /faults`, `GET|PUT /clock`, `GET|DELETE
/stats`, `GET /healthz`, `PUT /admin/tenants/{tenant}/orders/{id}/carrier-note`.

Faults apply to the tool-facing and ESP endpoints, in order: the call is counted, an outage is
503 at once, `latency_ms` is slept, an `error_rate` draw (made on arrival) may answer 503 (the
ESP records an email before sleeping `email_post_accept_latency_ms`); `mcp_outage`: /mcp 503s.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import threading
from collections import Counter
from collections.abc import Callable, Coroutine
from dataclasses import replace
from datetime import UTC, date, datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, FastAPI, Header, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException
from typing_extensions import TypedDict

from parley.demo_backend.data import (
    DEMO_TODAY,
    SEED,
    AttachmentJSON,
    Catalog,
    Customer,
    CustomerJSON,
    EligibilityJSON,
    Email,
    EmailAccepted,
    EmailRecords,
    EmailStatus,
    Order,
    OrderJSON,
    OrderList,
    Refund,
    RefundJSON,
    RefundList,
    return_eligibility,
)
from parley.demo_backend.mcp_server import mount_mcp
from parley.demo_backend.returns import returns
from parley.demo_backend.search import search

# Names `GET /stats` counts calls under, all listed even at zero so tests can index them.
CALL_NAMES = (
    "get_customer",
    "list_orders",
    "get_order",
    "get_refund",
    "return_eligibility",
    "list_refunds",
    "search_orders",
    "send_email",
    "get_email_by_key",
)


class BackendError(Exception):
    """An answer in the error shape of api.md: `{"error": {"code", "message"}}`."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


def _not_found(what: str) -> BackendError:
    # The message names only the kind of thing, never the id, so that "someone else's" and
    # "missing" are byte-for-byte the same answer.
    return BackendError(404, "not_found", f"{what} not found")


class Faults(BaseModel):
    # Unknown fields are refused: a typo in a test ("latency") fails loudly, never injects nothing.
    model_config = ConfigDict(extra="forbid", frozen=True)

    latency_ms: int = Field(default=0, ge=0)
    error_rate: float = Field(default=0.0, ge=0.0, le=1.0)
    outage: bool = False
    mcp_outage: bool = False
    email_post_accept_latency_ms: int = Field(default=0, ge=0)


class EmailIn(BaseModel):
    tenant: str = Field(min_length=1)
    to: str = Field(min_length=1)
    subject: str
    body: str
    attachments: list[AttachmentJSON] = []


class ClockIn(BaseModel):
    today: date


class CarrierNoteIn(BaseModel):
    note: str | None  # None clears the note


class Backend:
    """All mutable state of one service instance.

    Every read or change of a collection happens under one lock, which is never held across an
    await: check-then-act steps (the ESP's "is this key new?") are then atomic on whichever event
    loop or thread serves the request, and a plain `threading.Lock` is enough.
    """

    def __init__(self, catalog: Catalog, *, today: date, seed: int) -> None:
        self._lock = threading.Lock()
        self._seed = seed
        self._rng = random.Random(seed)
        self._today = today
        self._faults = Faults()
        self._calls: Counter[str] = Counter()
        # Insertion-ordered, so `GET /emails` lists emails in the order they were accepted.
        self._emails: dict[str, Email] = {}
        self._customers = {(c.tenant, c.customer_id): c for c in catalog.customers}
        self._orders = {(o.tenant, o.order_id): o for o in catalog.orders}
        self._refunds = {(r.tenant, r.order_id): r for r in catalog.refunds}

    # Clock, faults and stats.

    @property
    def today(self) -> date:
        return self._today

    def set_today(self, today: date) -> None:
        with self._lock:
            self._today = today

    @property
    def faults(self) -> Faults:
        return self._faults

    def set_faults(self, faults: Faults) -> None:
        with self._lock:
            self._faults = faults
            # Reseeded on every change, so the same faults after the same calls give the same
            # failures however many calls came before.
            self._rng = random.Random(self._seed)

    def admit(self, name: str) -> tuple[Faults, bool]:
        """Count a call and decide whether `error_rate` fails it; returns the faults in force."""
        with self._lock:
            self._calls[name] += 1
            faults = self._faults
            fail = faults.error_rate > 0 and self._rng.random() < faults.error_rate
            return faults, fail

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {name: self._calls[name] for name in CALL_NAMES}

    def reset_stats(self) -> None:
        with self._lock:
            self._calls.clear()

    # Orders and refunds, always scoped to (tenant, customer).

    def customer(self, tenant: str, customer_id: str) -> Customer | None:
        with self._lock:
            return self._customers.get((tenant, customer_id))

    def orders(self, tenant: str, customer_id: str) -> list[Order]:
        with self._lock:
            return [
                o
                for o in self._orders.values()
                if (o.tenant, o.customer_id) == (tenant, customer_id)
            ]

    def order(self, tenant: str, customer_id: str, order_id: str) -> Order | None:
        with self._lock:
            order = self._orders.get((tenant, order_id))
        return order if order is not None and order.customer_id == customer_id else None

    def refund(self, tenant: str, customer_id: str, order_id: str) -> Refund | None:
        with self._lock:
            refund = self._refunds.get((tenant, order_id))
        return refund if refund is not None and refund.customer_id == customer_id else None

    def refunds(self, tenant: str, customer_id: str) -> list[Refund]:
        with self._lock:
            return [
                r
                for r in self._refunds.values()
                if (r.tenant, r.customer_id) == (tenant, customer_id)
            ]

    def set_carrier_note(self, tenant: str, order_id: str, note: str | None) -> Order | None:
        with self._lock:
            order = self._orders.get((tenant, order_id))
            if order is None:
                return None
            self._orders[(tenant, order_id)] = replace(order, carrier_note=note)
            return self._orders[(tenant, order_id)]

    # The email service.

    def accept_email(self, key: str, email: EmailIn) -> tuple[Email, bool]:
        """Record `email` under `key` unless the key is known; returns the record and whether
        it is new. A known key returns the first record even if the new body differs."""
        with self._lock:
            known = self._emails.get(key)
            if known is not None:
                return known, False
            record = Email(
                # Derived from the key, so ids do not depend on the order of concurrent requests.
                message_id="em_" + hashlib.sha256(key.encode()).hexdigest()[:20],
                idempotency_key=key,
                tenant=email.tenant,
                to=email.to,
                subject=email.subject,
                body=email.body,
                accepted_at=datetime.now(UTC).isoformat(),
                attachments=tuple(email.attachments),
            )
            self._emails[key] = record
            return record, True

    def email(self, key: str) -> Email | None:
        with self._lock:
            return self._emails.get(key)

    def emails(self) -> list[Email]:
        with self._lock:
            return list(self._emails.values())


def get_backend(request: Request) -> Backend:
    return request.app.state.backend


BackendDep = Annotated[Backend, Depends(get_backend)]


def fault_gate(name: str) -> Callable[[Backend], Coroutine[Any, Any, None]]:
    """A route dependency that counts the call as `name` and applies the injected faults."""

    async def gate(backend: BackendDep) -> None:
        faults, fail = backend.admit(name)
        if faults.outage:
            raise BackendError(503, "unavailable", "service unavailable (injected outage)")
        if faults.latency_ms:
            await asyncio.sleep(faults.latency_ms / 1000)
        if fail:
            raise BackendError(503, "unavailable", "service unavailable (injected error)")

    return gate


def _gated(name: str) -> list[Any]:
    return [Depends(fault_gate(name))]


tools = APIRouter(prefix="/v1/tenants/{tenant}/customers/{customer}", tags=["tools"])


def _order_or_404(backend: Backend, tenant: str, customer: str, order_id: str) -> Order:
    order = backend.order(tenant, customer, order_id)
    if order is None:
        raise _not_found("order")
    return order


@tools.get("", dependencies=_gated("get_customer"))
async def get_customer(tenant: str, customer: str, backend: BackendDep) -> CustomerJSON:
    """The customer's profile and email on file."""
    found = backend.customer(tenant, customer)
    if found is None:
        raise _not_found("customer")
    return found.to_json()


@tools.get("/orders", dependencies=_gated("list_orders"))
async def list_orders(
    tenant: str, customer: str, backend: BackendDep, status: Literal["open", "all"] = "all"
) -> OrderList:
    """The customer's orders, newest first; `open` means neither delivered nor cancelled."""
    if backend.customer(tenant, customer) is None:
        raise _not_found("customer")
    orders = backend.orders(tenant, customer)
    return {"orders": [o.to_json() for o in orders if status == "all" or o.is_open]}


@tools.get("/orders/{order_id}", dependencies=_gated("get_order"))
async def get_order(tenant: str, customer: str, order_id: str, backend: BackendDep) -> OrderJSON:
    """One of the customer's orders."""
    return _order_or_404(backend, tenant, customer, order_id).to_json()


@tools.get("/orders/{order_id}/refund", dependencies=_gated("get_refund"))
async def get_refund(tenant: str, customer: str, order_id: str, backend: BackendDep) -> RefundJSON:
    """The refund on one of the customer's orders; 404 if it has none."""
    _order_or_404(backend, tenant, customer, order_id)
    refund = backend.refund(tenant, customer, order_id)
    if refund is None:
        raise _not_found("refund")
    return refund.to_json()


@tools.get("/orders/{order_id}/return-eligibility", dependencies=_gated("return_eligibility"))
async def get_return_eligibility(
    tenant: str, customer: str, order_id: str, backend: BackendDep
) -> EligibilityJSON:
    """Whether the order can still be returned, by the service's clock."""
    order = _order_or_404(backend, tenant, customer, order_id)
    return return_eligibility(order, backend.today)


@tools.get("/refunds", dependencies=_gated("list_refunds"))
async def list_refunds(tenant: str, customer: str, backend: BackendDep) -> RefundList:
    """Every refund of the customer."""
    if backend.customer(tenant, customer) is None:
        raise _not_found("customer")
    return {"refunds": [r.to_json() for r in backend.refunds(tenant, customer)]}


esp = APIRouter(prefix="/v1/emails", tags=["email service"])


@esp.post("", status_code=202, dependencies=_gated("send_email"))
async def send_email(
    email: EmailIn,
    backend: BackendDep,
    idempotency_key: Annotated[str | None, Header()] = None,
) -> EmailAccepted:
    """Accept an email for sending; the same `Idempotency-Key` never sends twice."""
    if not idempotency_key:
        raise BackendError(
            400, "idempotency_key_required", "the Idempotency-Key header is required"
        )
    record, new = backend.accept_email(idempotency_key, email)
    delay = backend.faults.email_post_accept_latency_ms
    if new and delay:
        # Only the request that recorded the email is slowed: a retry with the same key is the
        # caller recovering, and answering it at once is what a real ESP's replay does.
        await asyncio.sleep(delay / 1000)
    return {"message_id": record.message_id, "status": "accepted"}


@esp.get("/by-key/{key:path}", dependencies=_gated("get_email_by_key"))
async def get_email_by_key(key: str, backend: BackendDep) -> EmailStatus:
    """What the service accepted under an idempotency key, for callers that lost the answer."""
    record = backend.email(key)
    if record is None:
        raise _not_found("email")
    return record.status_json()


control = APIRouter(tags=["control"])


class ClockJSON(TypedDict):
    today: str


class StatsJSON(TypedDict):
    calls: dict[str, int]


@control.get("/emails")
async def list_emails(backend: BackendDep) -> EmailRecords:
    """Every email the ESP accepted, one per idempotency key, oldest first."""
    return {"emails": backend.emails()}


@control.get("/faults")
async def get_faults(backend: BackendDep) -> Faults:
    """The faults in force."""
    return backend.faults


@control.post("/faults")
async def set_faults(faults: Faults, backend: BackendDep) -> Faults:
    """Replace the faults in force; fields left out are off."""
    backend.set_faults(faults)
    return faults


@control.delete("/faults")
async def clear_faults(backend: BackendDep) -> Faults:
    """Switch every fault off."""
    backend.set_faults(Faults())
    return backend.faults


@control.get("/clock")
async def get_clock(backend: BackendDep) -> ClockJSON:
    """The service's "today", which return eligibility is computed from."""
    return {"today": backend.today.isoformat()}


@control.put("/clock")
async def set_clock(clock: ClockIn, backend: BackendDep) -> ClockJSON:
    """Move the service's "today"."""
    backend.set_today(clock.today)
    return {"today": backend.today.isoformat()}


@control.get("/stats")
async def get_stats(backend: BackendDep) -> StatsJSON:
    """Calls that reached each tool-facing and ESP endpoint, faulted ones included."""
    return {"calls": backend.stats()}


@control.delete("/stats")
async def reset_stats(backend: BackendDep) -> StatsJSON:
    """Reset every call count to zero."""
    backend.reset_stats()
    return {"calls": backend.stats()}


@control.put("/admin/tenants/{tenant}/orders/{order_id}/carrier-note")
async def set_carrier_note(
    tenant: str, order_id: str, note: CarrierNoteIn, backend: BackendDep
) -> OrderJSON:
    """Set an order's free-text carrier note (tests plant injection attempts here)."""
    order = backend.set_carrier_note(tenant, order_id, note.note)
    if order is None:
        raise _not_found("order")
    return order.to_json()


@control.get("/healthz")
async def healthz() -> dict[str, str]:
    """The process is up."""
    return {"status": "ok"}


def _error(status: int, code: str, message: str, **extra: Any) -> JSONResponse:
    return JSONResponse({"error": {"code": code, "message": message, **extra}}, status_code=status)


async def _backend_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, BackendError)
    return _error(exc.status, exc.code, exc.message)


async def _validation_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    first: dict[str, Any] = next(iter(exc.errors()), {})
    field = ".".join(str(p) for p in first.get("loc", ()) if p not in ("body", "query")) or None
    message = f"{field}: {first.get('msg', 'invalid')}" if field else "invalid request"
    return _error(422, "invalid_request", message, field=field)


async def _http_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
    return _error(exc.status_code, code, str(exc.detail))


def create_app(*, today: date = DEMO_TODAY, seed: int = 0) -> FastAPI:
    """A fresh backend with the seed data, its clock at `today`, errors drawn from `seed`."""
    app = FastAPI(
        title="Northwind demo backend",
        version="1",
        summary="Orders, refunds and an email service for Parley's demo and tests.",
    )
    backend = app.state.backend = Backend(SEED, today=today, seed=seed)
    mount_mcp(app, lambda t, u: (backend.faults.mcp_outage, backend.customer(t, u) is not None))
    app.add_exception_handler(BackendError, _backend_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.include_router(tools)
    app.include_router(esp)
    app.include_router(control)
    app.include_router(search, dependencies=_gated("search_orders"))
    app.include_router(returns)
    return app
