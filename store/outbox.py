"""The start outbox's queries: a turn row whose workflow start was never confirmed."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncSession

from store.models import Turn


async def mark_workflow_started(db: AsyncSession, *, turn_id: str) -> None:
    await db.execute(
        update(Turn)
        .where(Turn.id == turn_id, Turn.workflow_started_at.is_(None))
        .values(workflow_started_at=datetime.now(UTC))
    )


async def unstarted_turns(
    db: AsyncSession, *, older_than: timedelta, limit: int = 50
) -> list[Turn]:
    """Turns committed by the API whose workflow start was never confirmed."""
    cutoff = datetime.now(UTC) - older_than
    rows = await db.scalars(
        select(Turn)
        .where(Turn.workflow_started_at.is_(None), Turn.created_at < cutoff)
        .order_by(Turn.created_at)
        .limit(limit)
    )
    return list(rows)
