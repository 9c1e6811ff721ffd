"""Who is watching a turn, so that a running turn nobody watches any more is cancelled."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import case, func, update
from sqlalchemy.ext.asyncio import AsyncSession

from parley.contracts import TERMINAL_TURN_STATES, TurnState
from store.models import Turn


async def attach_viewer(db: AsyncSession, *, turn_id: str) -> None:
    await db.execute(
        update(Turn).where(Turn.id == turn_id).values(viewers=Turn.viewers + 1, detached_at=None)
    )


async def detach_viewer(db: AsyncSession, *, turn_id: str) -> None:
    await db.execute(
        update(Turn)
        .where(Turn.id == turn_id)
        .values(
            viewers=func.greatest(Turn.viewers - 1, 0),
            detached_at=case((Turn.viewers <= 1, func.now()), else_=None),
        )
    )


async def abandoned(db: AsyncSession, *, turn_id: str, grace: timedelta) -> bool:
    """Nobody has watched this running turn for `grace`. A turn resting for a confirmation
    (or a specialist's question) is not running, so it is never abandoned."""
    turn = await db.get(Turn, turn_id, populate_existing=True)
    if turn is None or turn.viewers > 0 or turn.detached_at is None:
        return False
    if turn.state in TERMINAL_TURN_STATES or turn.state in (
        TurnState.awaiting_confirmation,
        TurnState.awaiting_input,
    ):
        return False
    return turn.detached_at <= datetime.now(UTC) - grace + timedelta(milliseconds=50)
