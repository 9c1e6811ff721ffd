"""Conversation slots with provenance, written by code on every change of referent."""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession

from parley.resolver import Slot
from parley.store.models import SessionSlot


async def get_slots(db: AsyncSession, *, session_id: str) -> dict[str, Slot]:
    # Columns, not mapped rows: nothing here is written back through the session.
    rows = await db.execute(
        select(
            SessionSlot.name, SessionSlot.value, SessionSlot.source, SessionSlot.set_at_seq
        ).where(SessionSlot.session_id == session_id)
    )
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


def after_writes(
    current: dict[str, Slot], *, writes: dict[str, Slot], clears: tuple[str, ...] = ()
) -> dict[str, Slot]:
    """The slots as `write_slots` leaves them, without reading them back: `current` less
    `clears`, with `writes` over it, each value as stored (JSON) and so as a read returns it."""
    kept = {name: slot for name, slot in current.items() if name not in clears}
    for name, slot in writes.items():
        kept[name] = Slot(json.loads(json.dumps(slot.value)), slot.source, slot.set_at_seq)
    return kept


def slots_view(slots: dict[str, Slot]) -> dict[str, dict[str, Any]]:
    return {
        name: {"value": s.value, "source": s.source, "set_at_seq": s.set_at_seq}
        for name, s in slots.items()
    }
