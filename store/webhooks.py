"""The tenant webhook's record (the rules: parley/webhooks.py): each tenant's secret, made
once at first use, and the delivery log, one row per case (or budget notice, or budget
approval) and event, whose payload every attempt sends again. Nothing here commits (see
`store`)."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg.types.json import Jsonb

from parley.store.db import Db


async def tenant_secret(db: Db, *, tenant_id: str) -> str | None:
    """The tenant's webhook secret, made now if it has none (None: no such tenant)."""
    made = secrets.token_hex(32)
    found = await db.value(_SECRET, {"tenant_id": tenant_id, "made": made})
    return None if found is None else str(found)


_SECRET = """
    UPDATE tenants SET webhook_secret = coalesce(webhook_secret, %(made)s)
    WHERE id = %(tenant_id)s
    RETURNING webhook_secret
"""


@dataclass(frozen=True)
class DeliveryRow:
    id: str
    tenant_id: str
    handoff_id: str | None  # None: a budget event
    event: str
    url: str
    payload: dict[str, Any]
    status: str
    attempts: int
    last_status_code: int | None
    last_error: str | None
    created_at: datetime
    delivered_at: datetime | None


_COLUMNS = (
    "id, tenant_id, handoff_id, event, url, payload, status, attempts, last_status_code, "
    "last_error, created_at, delivered_at"
)


async def record(
    db: Db,
    *,
    delivery_id: str,
    tenant_id: str,
    session_id: str | None,
    handoff_id: str | None,
    event: str,
    url: str,
    payload: dict[str, Any],
) -> DeliveryRow:
    """The delivery, as the first attempt wrote it: a later attempt sends what it holds."""
    params = {
        "id": delivery_id,
        "tenant_id": tenant_id,
        "session_id": session_id,
        "handoff_id": handoff_id,
        "event": event,
        "url": url,
        "payload": Jsonb(payload),
    }
    row = await db.row(_RECORD, params, DeliveryRow)
    if row is None:
        row = await db.row(_DELIVERY, {"id": delivery_id}, DeliveryRow)
    assert row is not None
    return row


_RECORD = f"""
    INSERT INTO webhook_deliveries (id, tenant_id, session_id, handoff_id, event, url, payload,
        status)
    VALUES (%(id)s, %(tenant_id)s, %(session_id)s, %(handoff_id)s, %(event)s, %(url)s,
        %(payload)s, 'pending')
    ON CONFLICT (id) DO NOTHING
    RETURNING {_COLUMNS}
"""
_DELIVERY = f"SELECT {_COLUMNS} FROM webhook_deliveries WHERE id = %(id)s"


async def attempted(
    db: Db, *, delivery_id: str, status: str, code: int | None = None, error: str | None = None
) -> None:
    """One attempt's outcome: `delivered`, `pending` (to be tried again), `refused`, `failed`."""
    params = {"id": delivery_id, "status": status, "code": code, "error": error}
    await db.run(_ATTEMPTED, params)


_ATTEMPTED = """
    UPDATE webhook_deliveries SET attempts = attempts + 1,
        status = CAST(%(status)s AS varchar), last_status_code = %(code)s,
        last_error = %(error)s,
        delivered_at = CASE WHEN CAST(%(status)s AS varchar) = 'delivered' THEN now() END
    WHERE id = %(id)s AND status <> 'delivered'
"""


async def deliveries(db: Db, *, tenant_id: str, limit: int = 100) -> list[DeliveryRow]:
    """The tenant's delivery log, newest first."""
    params = {"tenant_id": tenant_id, "limit": limit}
    return await db.rows(_DELIVERIES, params, DeliveryRow)


_DELIVERIES = f"""
    SELECT {_COLUMNS} FROM webhook_deliveries WHERE tenant_id = %(tenant_id)s
    ORDER BY created_at DESC, id DESC LIMIT %(limit)s
"""
