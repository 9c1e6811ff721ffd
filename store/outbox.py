"""The start outbox's queries: a turn row whose workflow start was never confirmed, and a
turn row still open whose workflow may have closed without ending it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from parley.contracts import TERMINAL_TURN_STATES, TurnState
from parley.store import turns
from parley.store.db import Conn, session_conn
from parley.store.models import Turn
from parley.store.queue import Startable
from parley.store.rows import typed_row
from parley.wire import ErrorData


async def turn_number(db: AsyncSession, *, turn_id: str) -> int:
    """The turn's place in its session (1 for the first; a retry is a turn of its own), for
    the workflow's summary in the Temporal UI."""
    this = select(Turn.session_id, Turn.created_at).where(Turn.id == turn_id).subquery()
    count = await db.scalar(
        select(func.count())
        .select_from(Turn)
        .join(this, Turn.session_id == this.c.session_id)
        .where(Turn.created_at <= this.c.created_at)
    )
    return int(count or 0)


async def mark_workflow_started(db: AsyncSession | Conn, *, turn_id: str) -> None:
    conn = db if isinstance(db, Conn) else await session_conn(db)
    await conn.run(_MARK_STARTED, {"turn_id": turn_id, "now": datetime.now(UTC)})


# Plain SQL on psycopg's own connection: every turn the API starts runs it.
_MARK_STARTED = (
    "UPDATE turns SET workflow_started_at = %(now)s"
    " WHERE id = %(turn_id)s AND workflow_started_at IS NULL"
)


async def unstarted_turns(
    db: AsyncSession, *, older_than: timedelta, limit: int = 50
) -> list[Startable]:
    """Turns committed by the API whose workflow start was never confirmed. Only turns still
    in `received`: a turn that ended (a cancel raced the start) is never started."""
    cutoff = datetime.now(UTC) - older_than
    rows = await db.scalars(
        select(Turn)
        .where(
            Turn.workflow_started_at.is_(None),
            Turn.created_at < cutoff,
            Turn.state == TurnState.received,
        )
        .order_by(Turn.created_at)
        .limit(limit)
    )
    return [typed_row(Startable, row) for row in rows]


async def quiet_open_turns(
    db: AsyncSession, *, quiet_for: timedelta, limit: int = 50
) -> list[Startable]:
    """Started turns that have not ended and have written nothing for `quiet_for`: the sweep
    asks Temporal whether their workflow still runs."""
    cutoff = datetime.now(UTC) - quiet_for
    rows = await db.scalars(
        select(Turn)
        .where(
            Turn.state.not_in([s.value for s in TERMINAL_TURN_STATES]),
            Turn.workflow_started_at.is_not(None),
            Turn.updated_at < cutoff,
        )
        .order_by(Turn.updated_at)
        .limit(limit)
    )
    return [typed_row(Startable, row) for row in rows]


async def end_unstarted_turn(
    db: AsyncSession, *, turn_id: str, state: TurnState, error: ErrorData | None = None
) -> None:
    """End a turn whose workflow will not run it (never started, or closed), and mark it
    started, in the caller's one transaction: the outbox can never start it afterwards."""
    await turns.end_unfinished_turn(db, turn_id=turn_id, state=state, error=error)
    await mark_workflow_started(db, turn_id=turn_id)
