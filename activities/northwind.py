"""The HTTP adapter to the Northwind order system and its email service.

Every call names the tenant and customer taken from the session, never from the model.
Failures are sorted into the few kinds the executor acts on:

    BackendError
    ├── BackendNotFound      404: no such thing *for this customer* (ownership included)
    ├── BackendUnavailable   5xx, timeouts, connection errors, or the breaker is open
    └── BackendRejected      any other 4xx: a bug on our side, not worth retrying

The circuit breaker sits here, in the one place every call passes through.
"""

from __future__ import annotations

from datetime import date
from typing import Any
from urllib.parse import quote, urlencode

import httpx

from parley.breaker import CircuitBreaker


class BackendError(Exception):
    pass


class BackendNotFound(BackendError):
    pass


class BackendUnavailable(BackendError):
    def __init__(self, message: str, *, breaker_open: bool = False) -> None:
        super().__init__(message)
        self.breaker_open = breaker_open


class BackendRejected(BackendError):
    pass


class NorthwindClient:
    def __init__(
        self,
        *,
        base_url: str,
        http: httpx.AsyncClient,
        breaker: CircuitBreaker,
        timeout_s: float,
    ) -> None:
        self._base = base_url.rstrip("/")
        self._http = http
        self.breaker = breaker
        self._timeout = timeout_s

    async def _request(
        self, method: str, path: str, *, json: Any = None, headers: dict[str, str] | None = None
    ) -> Any:
        if not self.breaker.allow():
            raise BackendUnavailable(
                "the order system is not answering (circuit open)", breaker_open=True
            )
        try:
            response = await self._http.request(
                method, self._base + path, json=json, headers=headers, timeout=self._timeout
            )
        except httpx.HTTPError as exc:
            self.breaker.record_failure()
            raise BackendUnavailable(f"{type(exc).__name__} calling the order system") from exc
        if response.status_code >= 500:
            self.breaker.record_failure()
            raise BackendUnavailable(f"the order system answered {response.status_code}")
        self.breaker.record_success()
        if response.status_code == 404:
            raise BackendNotFound(path)
        if response.status_code >= 400:
            raise BackendRejected(f"{response.status_code}: {response.text[:200]}")
        return response.json()

    def _customer(self, tenant: str, customer: str) -> str:
        return f"/v1/tenants/{quote(tenant, safe='')}/customers/{quote(customer, safe='')}"

    async def get_customer(self, tenant: str, customer: str) -> dict[str, Any]:
        return dict(await self._request("GET", self._customer(tenant, customer)))

    async def list_orders(self, tenant: str, customer: str, *, open_only: bool) -> list[Any]:
        status = "open" if open_only else "all"
        body = await self._request(
            "GET", f"{self._customer(tenant, customer)}/orders?status={status}"
        )
        return list(body["orders"])

    async def list_refunds(self, tenant: str, customer: str) -> list[Any]:
        body = await self._request("GET", f"{self._customer(tenant, customer)}/refunds")
        return list(body["refunds"])

    async def order_resource(
        self, tenant: str, customer: str, order_id: str, suffix: str = ""
    ) -> dict[str, Any]:
        path = f"{self._customer(tenant, customer)}/orders/{quote(order_id, safe='')}{suffix}"
        return dict(await self._request("GET", path))

    async def search_orders(
        self, tenant: str, customer: str, query: dict[str, Any]
    ) -> list[dict[str, Any]]:
        params = urlencode({k: v for k, v in query.items() if v is not None})
        path = f"{self._customer(tenant, customer)}/order-search" + (f"?{params}" if params else "")
        return list((await self._request("GET", path))["orders"])

    async def today(self) -> date | None:
        """The backend's "today" (the demo's settable clock); None if it keeps none."""
        try:
            return date.fromisoformat(str((await self._request("GET", "/clock"))["today"]))
        except (BackendError, KeyError, ValueError):
            return None

    async def send_email(
        self,
        *,
        idempotency_key: str,
        tenant: str,
        to: str,
        subject: str,
        body: str,
        attachments: list[dict[str, Any]] | None = None,
    ) -> str:
        email = {"tenant": tenant, "to": to, "subject": subject, "body": body}
        accepted = await self._request(
            "POST",
            "/v1/emails",
            json={**email, "attachments": attachments} if attachments else email,
            headers={"Idempotency-Key": idempotency_key},
        )
        return str(accepted["message_id"])

    async def email_by_key(self, idempotency_key: str) -> str | None:
        """The message id the email service accepted under this key, or None."""
        try:
            found = await self._request(
                "GET", f"/v1/emails/by-key/{quote(idempotency_key, safe='')}"
            )
        except BackendNotFound:
            return None
        return str(found["message_id"])

    async def create_return(
        self, *, idempotency_key: str, tenant: str, customer: str, args: dict[str, Any]
    ) -> dict[str, Any]:
        """Create a return of one item (demo_backend/returns.py); the same key again answers
        with the return made the first time, so a retried call creates one."""
        return dict(
            await self._request(
                "POST",
                f"{self._customer(tenant, customer)}/returns",
                json={k: args[k] for k in ("order_id", "item_id", "reason")},
                headers={"Idempotency-Key": idempotency_key},
            )
        )
