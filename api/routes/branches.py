"""Versions of a conversation: edit a user message or regenerate an answer into a new
branch, and switch the version shown (store/branches.py)."""

from __future__ import annotations

from fastapi import APIRouter, BackgroundTasks, Path, Response

from parley.api.branch_schemas import EditMessageIn, VersionSwitched
from parley.api.delivery import deliver_decisions, start_turn
from parley.api.deps import AppSettings, AutocommitSessions, CurrentUser, DbSession, Temporal
from parley.api.errors import answers
from parley.api.schemas import TurnStarted
from parley.errors import (
    AgentPaused,
    DailyCapReached,
    FeatureNotEnabled,
    HandoffOpen,
    IdempotencyKeyReused,
    InvalidRequest,
    NotFound,
    RateLimited,
    TooManyActiveTurns,
    TurnInProgress,
    TurnNotRetryable,
)
from parley.store import branches
from parley.wire import VersionsView

router = APIRouter(
    prefix="/v1/sessions/{session_id}", tags=["branches"], responses=answers(NotFound)
)

_ADMITTED = (AgentPaused, FeatureNotEnabled, RateLimited, TooManyActiveTurns, DailyCapReached)


@router.post(
    "/messages/{message_id}/edit",
    status_code=202,
    responses={
        200: {"model": TurnStarted, "description": "The same edit again: its original turn"},
        **answers(TurnInProgress, HandoffOpen, IdempotencyKeyReused, InvalidRequest, *_ADMITTED),
    },
)
async def edit_message(
    session_id: str,
    message_id: str,
    body: EditMessageIn,
    response: Response,
    db: DbSession,
    one_statement: AutocommitSessions,
    user: CurrentUser,
    temporal: Temporal,
    settings: AppSettings,
    background: BackgroundTasks,
) -> TurnStarted:
    """Send a new version of one of the user's messages: the conversation goes on from it on
    a new branch, answered by a new turn; the earlier version and what followed it stay, one
    switch away. A card left pending is superseded."""
    if len(body.text) > settings.max_message_chars:
        raise InvalidRequest(f"text: at most {settings.max_message_chars} characters", field="text")
    edited = await branches.edit_message(
        db,
        owner=user,
        session_id=session_id,
        message_id=message_id,
        client_message_id=body.client_message_id,
        text=body.text,
        limits=settings.limits,
    )
    await db.commit()  # the branch, the message and its turn (the start outbox) first
    assert edited.turn is not None  # an edit always opens a turn
    await deliver_decisions(temporal, one_statement, edited.signals)
    if edited.start:
        await start_turn(temporal, one_statement, settings, edited.turn, background)
    response.status_code = 202 if edited.created else 200
    return TurnStarted.build(
        session_id=session_id,
        turn_id=edited.turn.id,
        state=edited.turn.state,
        message=edited.message,
    )


@router.post(
    "/turns/{turn_id}/regenerate",
    status_code=202,
    responses=answers(TurnNotRetryable, TurnInProgress, HandoffOpen, *_ADMITTED),
)
async def regenerate(
    session_id: str,
    turn_id: str,
    db: DbSession,
    one_statement: AutocommitSessions,
    user: CurrentUser,
    temporal: Temporal,
    settings: AppSettings,
    background: BackgroundTasks,
) -> TurnStarted:
    """Answer the turn's message again, on a new branch: the earlier answer and what followed
    it stay, one switch away. A card left pending is superseded."""
    again = await branches.regenerate(
        db, owner=user, session_id=session_id, turn_id=turn_id, limits=settings.limits
    )
    await db.commit()
    await deliver_decisions(temporal, one_statement, again.signals)
    assert again.turn is not None  # a regeneration always opens a turn
    await start_turn(temporal, one_statement, settings, again.turn, background)
    return TurnStarted.build(
        session_id=session_id, turn_id=again.turn.id, state=again.turn.state, message=again.message
    )


@router.post(
    "/messages/{message_id}/versions/{version}",
    responses=answers(TurnInProgress, HandoffOpen),
)
async def switch_version(
    session_id: str,
    message_id: str,
    db: DbSession,
    one_statement: AutocommitSessions,
    user: CurrentUser,
    temporal: Temporal,
    version: int = Path(ge=1, le=10_000),
) -> VersionSwitched:
    """Show another version of a message (`GET .../messages` lists each message's
    `versions`): the conversation becomes the one it belongs to, everywhere (the next
    prompt, exports, the page). A card left pending is superseded."""
    switched = await branches.switch_version(
        db, owner=user, session_id=session_id, message_id=message_id, version=version
    )
    await db.commit()
    await deliver_decisions(temporal, one_statement, switched.signals)
    count = switched.count
    return VersionSwitched(message_id=message_id, versions=VersionsView(count=count, shown=version))
