"""Sessions and their message history."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query

from api.deps import CurrentUser, DbSession
from api.schemas import message_view, session_summary, turn_view
from store import actions, slots
from store import sessions as store_sessions
from store.actions import action_view
from store.models import Turn

router = APIRouter(prefix="/v1/sessions", tags=["sessions"])


@router.post("", status_code=201)
async def create_session(db: DbSession, user: CurrentUser) -> dict[str, Any]:
    """Start a new, empty conversation."""
    session = await store_sessions.create_session(db, owner=user)
    await db.commit()
    return session_summary(session)


@router.get("")
async def list_sessions(db: DbSession, user: CurrentUser) -> dict[str, Any]:
    """List the caller's own sessions, newest first."""
    sessions = await store_sessions.list_sessions(db, owner=user)
    return {"sessions": [session_summary(s) for s in sessions]}


@router.get("/{session_id}")
async def get_session(session_id: str, db: DbSession, user: CurrentUser) -> dict[str, Any]:
    """One session with its active turn, pending action and slots (for resume after reload)."""
    session = await store_sessions.get_session(db, owner=user, session_id=session_id)
    active = await db.get(Turn, session.active_turn_id) if session.active_turn_id else None
    pending = await actions.pending_action(db, session_id=session_id)
    current = await slots.get_slots(db, session_id=session_id)
    return {
        **session_summary(session),
        "active_turn": turn_view(active, pending) if active is not None else None,
        "pending_action": action_view(pending) if pending is not None else None,
        "slots": slots.slots_view(current),
    }


@router.get("/{session_id}/messages")
async def list_messages(
    session_id: str,
    db: DbSession,
    user: CurrentUser,
    after_seq: int = Query(0, ge=0),
    limit: int = Query(100, ge=1, le=500),
) -> dict[str, Any]:
    """Messages after `after_seq`, in seq order."""
    messages = await store_sessions.list_messages(
        db, owner=user, session_id=session_id, after_seq=after_seq, limit=limit
    )
    return {"messages": [message_view(m) for m in messages]}
