"""Conversation slots with provenance, written by code on every change of referent."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from psycopg.types.json import Jsonb

from parley.resolver import Slot
from parley.store.db import Db


@dataclass(frozen=True)
class _SlotRow:
    name: str
    value: Any
    source: str
    set_at_seq: int


async def get_slots(db: Db, *, session_id: str) -> dict[str, Slot]:
    rows = await db.rows(_SLOTS, {"session_id": session_id}, _SlotRow)
    return {r.name: Slot(r.value, r.source, r.set_at_seq) for r in rows}


async def write_slots(
    db: Db,
    *,
    session_id: str,
    writes: dict[str, Slot],
    clears: tuple[str, ...] = (),
) -> None:
    """Apply slot changes within the caller's transaction."""
    if clears:
        await db.run(_CLEAR, {"session_id": session_id, "names": list(clears)})
    for name, slot in writes.items():
        values = {"value": Jsonb(slot.value), "source": slot.source, "seq": slot.set_at_seq}
        await db.run(_WRITE, {"session_id": session_id, "name": name} | values)


_SLOTS = "SELECT name, value, source, set_at_seq FROM slots WHERE session_id = %(session_id)s"
_CLEAR = "DELETE FROM slots WHERE session_id = %(session_id)s AND name = ANY(%(names)s)"
_WRITE = """
    INSERT INTO slots (session_id, name, value, source, set_at_seq)
    VALUES (%(session_id)s, %(name)s, %(value)s, %(source)s, %(seq)s)
    ON CONFLICT (session_id, name) DO UPDATE
    SET value = excluded.value, source = excluded.source, set_at_seq = excluded.set_at_seq
"""


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
