"""The per-turn event log behind every stream.

Appends take the turn row's lock to hand out the next id, so ids are gap-free and monotonic
even when two writers race (an activity retried while its old attempt is still finishing).
The NOTIFY is sent inside the same transaction, so listeners are woken only once the event
is committed and readable.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select, text
from sqlalchemy.ext.asyncio import AsyncSession

from store.models import TurnEvent

NOTIFY_CHANNEL = "parley_turn_events"


@dataclass(frozen=True)
class StoredEvent:
    id: int
    type: str
    data: dict[str, Any]


async def append_event(db: AsyncSession, *, turn_id: str, type: str, data: dict[str, Any]) -> int:
    """Append one event within the caller's transaction and return its id."""
    return (await append_events(db, turn_id=turn_id, events=[(type, data)]))[-1]


async def append_events(
    db: AsyncSession, *, turn_id: str, events: list[tuple[str, dict[str, Any]]]
) -> list[int]:
    first = await db.scalar(
        text(
            "UPDATE turns SET last_event_id = last_event_id + :n, updated_at = now() "
            "WHERE id = :turn_id RETURNING last_event_id - :n + 1"
        ),
        {"turn_id": turn_id, "n": len(events)},
    )
    if first is None:
        raise LookupError(f"turn {turn_id} does not exist")
    ids = list(range(first, first + len(events)))
    db.add_all(
        TurnEvent(turn_id=turn_id, id=event_id, type=type_, data=data)
        for event_id, (type_, data) in zip(ids, events, strict=True)
    )
    await db.flush()
    await db.execute(select(func.pg_notify(NOTIFY_CHANNEL, f"{turn_id}:{ids[-1]}")))
    return ids


async def read_events(
    db: AsyncSession, *, turn_id: str, after: int, limit: int = 500
) -> list[StoredEvent]:
    rows = await db.execute(
        select(TurnEvent.id, TurnEvent.type, TurnEvent.data)
        .where(TurnEvent.turn_id == turn_id, TurnEvent.id > after)
        .order_by(TurnEvent.id)
        .limit(limit)
    )
    return [StoredEvent(id=r.id, type=r.type, data=r.data) for r in rows]
