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

from typing import Any
from urllib.parse import quote

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

    async def send_email(
        self, *, idempotency_key: str, tenant: str, to: str, subject: str, body: str
    ) -> str:
        accepted = await self._request(
            "POST",
            "/v1/emails",
            json={"tenant": tenant, "to": to, "subject": subject, "body": body},
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
