"""A tenant's webhook: what it is told, how a receiver checks it, and its secret.

A tenant names one URL (`TenantConfig.handoff_webhook`) for its team's own tools (a chat
channel, a ticketing system, a pager). A case's workflow tells it of three events: `new` (a
case opened, with its summary), `unclaimed` (nobody claimed it within the tenant's timeout)
and `resolved`. Its budgets tell it of one more, `budget` (parley/budget_approvals.py), of two
kinds: `soft_threshold` (a budget's soft share crossed, once per budget and period) and
`approval_requested` (the tenant's month is used up: an operator may approve going on).
Each delivery is one JSON body, the same bytes on every attempt, under one
`Idempotency-Key` (`whk_<case>_<event>`, `whk_<approval>_budget`, `whk_bgt_<notice>_budget`),
so a receiver that failed an attempt sees the event again with the same key and keeps it
once.

The signature: `Parley-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>">`,
keyed with the tenant's secret, so a receiver checks the sender and refuses an old replay
(`t` too far from its clock). The secret is random, made once per tenant and kept on the
tenant's row (store/webhooks.py), never in its config (which holds no credentials); its
operator reads it with the delivery log (`GET /v1/admin/tenants/{tenant_id}/webhook`).
"""

from __future__ import annotations

import hashlib
import hmac
import json
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

WebhookEvent = Literal["new", "unclaimed", "resolved", "budget"]
BUDGET_EVENT = "budget"
# How far a receiver should let `t` be from its own clock (a suggestion, in the docs).
SIGNATURE_TOLERANCE_S = 300


class HandoffWebhookConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)  # as TenantConfig

    # Checked against the deployment's egress rules when saved and again at each delivery.
    url: str = Field(pattern=r"^https?://", max_length=500)


@dataclass(frozen=True)
class WebhookInput:
    """A delivery the case's workflow asks for: ids only."""

    handoff_id: str
    event: str


def delivery_id(*, handoff_id: str, event: str) -> str:
    """The delivery's id, and the receiver's idempotency key: one per case (or budget
    approval) and event."""
    return f"whk_{handoff_id}_{event}"


def body_bytes(payload: dict[str, Any]) -> bytes:
    """The body as sent: the same bytes for the same payload, every attempt."""
    return json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()


def signature(secret: str, timestamp: int, body: bytes) -> str:
    """The `Parley-Signature` header's value."""
    signed = f"{timestamp}.".encode() + body
    digest = hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={digest}"


def verify(secret: str, header: str, body: bytes, *, now: int) -> bool:
    """What a receiver does (and the tests): the signature matches and `t` is recent."""
    parts = dict(part.split("=", 1) for part in header.split(",") if "=" in part)
    try:
        timestamp = int(parts["t"])
    except (KeyError, ValueError):
        return False
    expected = signature(secret, timestamp, body)
    recent = abs(now - timestamp) <= SIGNATURE_TOLERANCE_S
    return recent and hmac.compare_digest(expected, header)
