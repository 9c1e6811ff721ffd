"""Confirm or decline a pending action: the user's own, bound answer to one proposal."""

from __future__ import annotations

from fastapi import APIRouter

from api.deps import CurrentUser, DbSession, Temporal
from api.errors import answers
from api.routes.turns import send_signals
from api.schemas import ActionOut
from parley.contracts import ResolveActionSignal
from parley.errors import ActionChanged, ActionExpired, ActionResolved, NotFound
from parley.wire import ActionView
from store import actions, chat

router = APIRouter(
    prefix="/v1/sessions/{session_id}/actions",
    tags=["confirmations"],
    responses=answers(NotFound, ActionResolved, ActionExpired, ActionChanged),
)


async def _resolve(
    session_id: str,
    action_id: str,
    decision: str,
    db: DbSession,
    user: CurrentUser,
    temporal: Temporal,
) -> ActionOut:
    await chat.get_session(db, owner=user, session_id=session_id)
    action = await actions.resolve_action(
        db, action_id=action_id, session_id=session_id, owner=user, decision=decision
    )
    view = ActionView.from_row(action)  # read before the commit expires the row
    await db.commit()
    await send_signals(temporal, ((action.turn_id, ResolveActionSignal(action.id, decision)),))
    return ActionOut(action=view)


@router.post("/{action_id}/confirm", status_code=202)
async def confirm(
    session_id: str, action_id: str, db: DbSession, user: CurrentUser, temporal: Temporal
) -> ActionOut:
    """Confirm the pending action exactly as shown; it runs once, however often this is sent."""
    return await _resolve(session_id, action_id, "confirmed", db, user, temporal)


@router.post("/{action_id}/decline", status_code=202)
async def decline(
    session_id: str, action_id: str, db: DbSession, user: CurrentUser, temporal: Temporal
) -> ActionOut:
    """Decline the pending action; nothing is sent."""
    return await _resolve(session_id, action_id, "declined", db, user, temporal)
