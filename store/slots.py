"""Conversation slots with provenance, written by code on every change of referent."""

from __future__ import annotations

from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession

from parley.resolver import Slot
from store.models import SessionSlot


async def get_slots(db: AsyncSession, *, session_id: str) -> dict[str, Slot]:
    rows = await db.scalars(select(SessionSlot).where(SessionSlot.session_id == session_id))
    return {r.name: Slot(r.value, r.source, r.set_at_seq) for r in rows}


async def write_slots(
    db: AsyncSession,
    *,
    session_id: str,
    writes: dict[str, Slot],
    clears: tuple[str, ...] = (),
) -> None:
    """Apply slot changes within the caller's transaction."""
    if clears:
        await db.execute(
            delete(SessionSlot).where(
                SessionSlot.session_id == session_id, SessionSlot.name.in_(clears)
            )
        )
    for name, slot in writes.items():
        values: dict[str, Any] = {
            "value": slot.value,
            "source": slot.source,
            "set_at_seq": slot.set_at_seq,
        }
        await db.execute(
            insert(SessionSlot)
            .values(session_id=session_id, name=name, **values)
            .on_conflict_do_update(index_elements=["session_id", "name"], set_=values)
        )


def slots_view(slots: dict[str, Slot]) -> dict[str, dict[str, Any]]:
    return {
        name: {"value": s.value, "source": s.source, "set_at_seq": s.set_at_seq}
        for name, s in slots.items()
    }
