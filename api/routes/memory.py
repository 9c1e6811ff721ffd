"""Durable memory, consent first: what Parley remembers about the caller across sessions."""

from __future__ import annotations

from fastapi import APIRouter, Response

from parley.api.deps import CurrentUser, DbSession
from parley.api.errors import answers
from parley.api.schemas import ConsentIn, MemoryItemOut, MemoryOut
from parley.errors import NotFound
from parley.store import user_memory

router = APIRouter(prefix="/v1/memory", tags=["memory"], responses=answers())


async def _view(db: DbSession, user: CurrentUser) -> MemoryOut:
    owner = {"tenant_id": user.tenant_id, "user_id": user.user_id}
    return MemoryOut(
        consent=await user_memory.has_consent(db, **owner),
        items=[MemoryItemOut.from_row(item) for item in await user_memory.items(db, **owner)],
    )


@router.get("")
async def get_memory(db: DbSession, user: CurrentUser) -> MemoryOut:
    """The caller's consent and the preferences remembered with it (off by default)."""
    return await _view(db, user)


@router.put("/consent")
async def put_consent(body: ConsentIn, db: DbSession, user: CurrentUser) -> MemoryOut:
    """Give or withdraw consent; withdrawing deletes every item and every copy made from one."""
    await user_memory.set_consent(
        db, tenant_id=user.tenant_id, user_id=user.user_id, consent=body.consent
    )
    await db.commit()
    return await _view(db, user)


@router.delete("/{key}", status_code=204, responses=answers(NotFound))
async def delete_item(key: str, db: DbSession, user: CurrentUser) -> Response:
    """Forget one remembered item, and the copies made from it."""
    owner = {"tenant_id": user.tenant_id, "user_id": user.user_id}
    if not await user_memory.forget(db, **owner, keys=[key]):
        raise NotFound("no remembered item has this key")
    await db.commit()
    return Response(status_code=204)
