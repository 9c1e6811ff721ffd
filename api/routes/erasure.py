"""Erasure: a user erases themselves, and anyone holding an erasure's id follows it.

`DELETE /v1/me` revokes the caller's tokens and records the erasure in one transaction, then
starts its workflow (workflows/erasure.py); if that start is lost, the worker's sweep makes
it. The status route needs no token, since the erased user has none left: the erasure's id
(random, 80 bits) is the link, and what it shows names nobody.
"""

from __future__ import annotations

from fastapi import APIRouter

from parley.api.delivery import start_erasure_soon
from parley.api.deps import (
    AppSettings,
    CurrentUser,
    DbSession,
    Sessions,
    Temporal,
)
from parley.api.errors import answers
from parley.api.schemas import ErasureOut, ErasureStarted
from parley.erasure import ErasureInput
from parley.errors import NotFound
from parley.store.lifecycle import erasure

router = APIRouter(tags=["erasure"])


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
    await start_erasure_soon(temporal, sessions, settings, ErasureInput(erasure_id=row.id))
    return ErasureStarted(erasure_id=row.id, status=row.status, status_url=f"/v1/erasures/{row.id}")


@router.get("/v1/erasures/{erasure_id}", responses=answers(NotFound, authenticated=False))
async def get_erasure(erasure_id: str, db: DbSession) -> ErasureOut:
    """An erasure's progress and, once done, its receipt: rows deleted per table, no names."""
    row = await erasure.get_erasure(db, erasure_id=erasure_id)
    if row is None:
        raise NotFound("no erasure has this id")
    return ErasureOut.from_row(row)
