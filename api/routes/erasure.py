"""Erasure: a user erases themselves, and anyone holding an erasure's id follows it.

`DELETE /v1/me` revokes the caller's tokens and records the erasure in one transaction, then
starts its workflow (workflows/erasure.py); if that start is lost, the worker's sweep makes
it. The status route needs no token, since the erased user has none left: the erasure's id
(random, 80 bits) is the link, and what it shows names nobody.
"""

from __future__ import annotations

import asyncio
import logging

from fastapi import APIRouter

from parley.api.deps import (
    AppSettings,
    CurrentUser,
    DbSession,
    Sessions,
    Temporal,
    TemporalConnector,
)
from parley.api.errors import answers
from parley.api.schemas import ErasureOut, ErasureStarted
from parley.config import Settings
from parley.dispatch.erasure import start_erasure
from parley.erasure import ErasureInput
from parley.errors import NotFound
from parley.store import erasure

log = logging.getLogger(__name__)

# How long a route waits on Temporal to start an erasure before leaving it to the sweep.
START_TIMEOUT_S = 5.0

router = APIRouter(tags=["erasure"])


async def start_soon(
    temporal: TemporalConnector, sessions: Sessions, settings: Settings, inp: ErasureInput
) -> None:
    """Start the erasure's workflow now if Temporal answers in time; otherwise the worker's
    sweep starts it (the row is committed)."""
    try:
        client = await asyncio.wait_for(temporal.get(), START_TIMEOUT_S)
        await asyncio.wait_for(
            start_erasure(client, sessions, inp, task_queue=settings.task_queue), START_TIMEOUT_S
        )
    except Exception:
        log.warning("could not start erasure %s; the sweep will", inp.erasure_id, exc_info=True)


@router.delete("/v1/me", status_code=202, responses=answers())
async def erase_me(
    db: DbSession, sessions: Sessions, user: CurrentUser, settings: AppSettings, temporal: Temporal
) -> ErasureStarted:
    """Erase the caller: every session, message, file, memory item, trace and token of theirs,
    then the account. The token stops working at once; follow `status_url` for the receipt."""
    row = await erasure.request_erasure(
        db, key=settings.erasure_receipt_key, tenant_id=user.tenant_id, user_id=user.user_id
    )
    await db.commit()
    await start_soon(temporal, sessions, settings, ErasureInput(erasure_id=row.id))
    return ErasureStarted(erasure_id=row.id, status=row.status, status_url=f"/v1/erasures/{row.id}")


@router.get("/v1/erasures/{erasure_id}", responses=answers(NotFound, authenticated=False))
async def get_erasure(erasure_id: str, db: DbSession) -> ErasureOut:
    """An erasure's progress and, once done, its receipt: rows deleted per table, no names."""
    row = await erasure.get_erasure(db, erasure_id=erasure_id)
    if row is None:
        raise NotFound("no erasure has this id")
    return ErasureOut.from_row(row)
