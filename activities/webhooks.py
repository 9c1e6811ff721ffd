"""One attempt at a tenant's webhook delivery (the rules: parley/webhooks.py), for whatever
tells it: a hand-off's workflow, a budget approval's, the sweep that delivers budget notices.

The delivery's row (store/webhooks.py) was written by its first attempt; every attempt sends
its payload's bytes again, signed now, under the row's id as the idempotency key, through
the deployment's egress rules, and records how it went.
"""

from __future__ import annotations

import time
from typing import Any

import httpx2
from temporalio.exceptions import ApplicationError

from parley.egress import Allowlist, Resolver
from parley.errors import UrlNotAllowed
from parley.gateway.pinned import pinned_transport
from parley.store import tenants
from parley.store import webhooks as hooks
from parley.store.db import Database, Db
from parley.webhooks import BUDGET_EVENT, body_bytes, signature

# One attempt's bound; whoever delivers retries (a workflow's `WEBHOOK` options, the sweep).
WEBHOOK_TIMEOUT_S = 10.0
# How an activity's attempt failed: an address the egress rules refuse is not retried; a
# receiver that did not take it is (Temporal's retries).
WEBHOOK_REFUSED = "webhook_refused"
WEBHOOK_FAILED = "webhook_failed"


class WebhookSender:
    def __init__(self, *, sessions: Database, allowlist: Allowlist, resolve: Resolver) -> None:
        self._sessions = sessions
        self._allowlist = allowlist
        self._resolve = resolve

    async def attempt(self, delivery: hooks.DeliveryRow, secret: str) -> tuple[str, str | None]:
        """Send the delivery once and record it: (`delivered` | `pending` | `refused`, what
        went wrong)."""
        status, code, error = await self._send(delivery, secret)
        async with self._sessions() as db:
            await hooks.attempted(
                db, delivery_id=delivery.id, status=status, code=code, error=error
            )
            await db.commit()
        return status, error

    async def deliver(self, planned: tuple[hooks.DeliveryRow, str] | None) -> str:
        """An activity's attempt at a planned delivery (None: the tenant has no webhook):
        its status, or an error Temporal retries unless the address is refused. A delivery
        that already ended is not sent again."""
        if planned is None:
            return "none"
        delivery, secret = planned
        if delivery.status in ("delivered", "refused"):
            return delivery.status
        status, error = await self.attempt(delivery, secret)
        if status == "refused":
            raise ApplicationError(error or "refused", type=WEBHOOK_REFUSED, non_retryable=True)
        if status != "delivered":
            raise ApplicationError(f"the receiver did not take it: {error}", type=WEBHOOK_FAILED)
        return status

    async def _send(
        self, delivery: hooks.DeliveryRow, secret: str
    ) -> tuple[str, int | None, str | None]:
        """One attempt: (status, the receiver's HTTP status, what went wrong)."""
        body = body_bytes(delivery.payload)
        headers = {
            "Content-Type": "application/json",
            "Idempotency-Key": delivery.id,
            "Parley-Event": delivery.event,
            "Parley-Signature": signature(secret, int(time.time()), body),
        }
        transport = pinned_transport(
            self._allowlist, field="handoff_webhook.url", resolve=self._resolve
        )
        try:
            async with httpx2.AsyncClient(
                transport=transport, trust_env=False, timeout=WEBHOOK_TIMEOUT_S
            ) as http:
                answer = await http.post(delivery.url, content=body, headers=headers)
        except UrlNotAllowed as exc:
            return "refused", None, exc.message
        except httpx2.HTTPError as exc:
            return "pending", None, f"{type(exc).__name__}: {exc}"[:500]
        if answer.is_success:
            return "delivered", answer.status_code, None
        return "pending", answer.status_code, f"HTTP {answer.status_code}"


async def plan_budget_delivery(
    db: Db, *, tenant_id: str, delivery_id: str, payload: dict[str, Any]
) -> tuple[hooks.DeliveryRow, str] | None:
    """A budget event's delivery to the tenant's webhook, as its first attempt wrote it, with
    the tenant's secret; None when the tenant has no webhook."""
    hook = (await tenants.tenant_config(db, tenant_id=tenant_id)).handoff_webhook
    if hook is None:
        return None
    secret = await hooks.tenant_secret(db, tenant_id=tenant_id)
    assert secret is not None
    delivery = await hooks.record(
        db,
        delivery_id=delivery_id,
        tenant_id=tenant_id,
        session_id=None,
        handoff_id=None,
        event=BUDGET_EVENT,
        url=hook.url,
        payload=payload,
    )
    return delivery, secret
