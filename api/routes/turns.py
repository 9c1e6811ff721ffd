"""Posting a message starts a turn; turns can be read and their events streamed."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator

from fastapi import APIRouter, BackgroundTasks, Response
from sse_starlette import EventSourceResponse, ServerSentEvent

from parley.api.delivery import start_turn as _start
from parley.api.deps import (
    After,
    AppSettings,
    AutocommitSessions,
    CurrentUser,
    DbSession,
    Hub,
    LastEventId,
    Sessions,
    Streams,
    Temporal,
    resume_after,
)
from parley.api.errors import answers
from parley.api.posting import post
from parley.api.schemas import CancelOut, PostMessageIn, TurnOut, TurnStarted
from parley.api.sse import live_response
from parley.api.streaming import Viewer, turn_event_batches
from parley.config import Settings
from parley.contracts import (
    TERMINAL_TURN_STATES,
    TurnState,
)
from parley.dispatch.control import cancel_turn_workflow
from parley.errors import (
    AgentPaused,
    DailyCapReached,
    FeatureNotEnabled,
    HandoffOpen,
    IdempotencyKeyReused,
    InvalidRequest,
    NotFound,
    RateLimited,
    StaleView,
    TooManyActiveTurns,
    TurnFinished,
    TurnInProgress,
    TurnNotRetryable,
)
from parley.store import actions, queue, retries
from parley.store import sessions as store_sessions
from parley.store.db import Db
from parley.store.identity import Identity
from parley.wire import TurnStreamEvent

log = logging.getLogger(__name__)

router = APIRouter(prefix="/v1/sessions/{session_id}", tags=["turns"], responses=answers(NotFound))

# How long the API waits on Temporal before leaving the start to the worker's outbox sweep.
START_TIMEOUT_S = 5.0

# An SSE id is any string on the wire; ours are event ids, so anything else is a 422. The
# length bound keeps `int()` cheap.


@router.post(
    "/messages",
    status_code=202,
    responses={
        200: {"model": TurnStarted, "description": "The same message again: its original turn"},
        **answers(
            StaleView,
            TurnInProgress,
            IdempotencyKeyReused,
            InvalidRequest,
            AgentPaused,
            FeatureNotEnabled,
            RateLimited,
            TooManyActiveTurns,
            DailyCapReached,
        ),
    },
)
async def post_message(
    session_id: str,
    body: PostMessageIn,
    response: Response,
    db: DbSession,
    one_statement: AutocommitSessions,
    user: CurrentUser,
    temporal: Temporal,
    settings: AppSettings,
    background: BackgroundTasks,
) -> TurnStarted:
    """Store a user message and start its turn; posted while the session's turn runs, it is
    queued as the next turn (`queued`, at most one), or with `"mode": "steer"` taken into the
    running turn; while a person holds the session (a hand-off), it goes to them and no turn
    starts; a repeated `client_message_id` is answered with the original turn."""
    posted = await post(session_id, body, db, one_statement, user, temporal, settings, background)
    response.status_code = 202 if posted.created else 200
    return posted.started


@router.get("/turns/{turn_id}")
async def get_turn(
    session_id: str, turn_id: str, db: DbSession, user: CurrentUser, settings: AppSettings
) -> TurnOut:
    """The turn's state, its pending action, once answered its assistant message id, and its
    workflow in the Temporal UI when that is configured."""
    turn = await store_sessions.get_turn(db, owner=user, session_id=session_id, turn_id=turn_id)
    pending = await actions.pending_action(db, session_id=session_id)
    return TurnOut.from_row(
        turn,
        pending if pending is not None and pending.turn_id == turn.id else None,
        settings=settings,
    )


@router.post("/turns/{turn_id}/cancel", status_code=202, responses=answers(TurnFinished))
async def cancel_turn(
    session_id: str,
    turn_id: str,
    db: DbSession,
    sessions: Sessions,
    user: CurrentUser,
    temporal: Temporal,
    settings: AppSettings,
) -> CancelOut:
    """Stop the turn: the model stream stops, what streamed is kept as `cancelled`. A queued
    turn is dropped (its message never joins the conversation). A `202` means the turn ends
    `cancelled`; a turn that has already ended answers `409`."""
    turn = await store_sessions.get_turn(db, owner=user, session_id=session_id, turn_id=turn_id)
    if turn.state in TERMINAL_TURN_STATES:
        raise TurnFinished(f"the turn is already {turn.state}", state=turn.state)
    if turn.state == TurnState.queued:
        if await queue.drop_queued(db, owner=user, session_id=session_id, turn_id=turn_id):
            await db.commit()
            return await _cancelled(db, user, session_id, turn_id, settings)
    await db.rollback()  # the Stop is recorded under the row lock, in its own transaction
    client = await asyncio.wait_for(temporal.get(), START_TIMEOUT_S)
    await cancel_turn_workflow(client, sessions, turn_id=turn_id)
    return await _cancelled(db, user, session_id, turn_id, settings)


async def _cancelled(
    db: Db, user: Identity, session_id: str, turn_id: str, settings: Settings
) -> CancelOut:
    """The turn as the Stop left it (read again: another transaction moved it)."""
    turn = await store_sessions.get_turn(db, owner=user, session_id=session_id, turn_id=turn_id)
    return CancelOut(turn=TurnOut.from_row(turn, settings=settings))


@router.post(
    "/turns/{turn_id}/retry",
    status_code=202,
    responses=answers(
        TurnNotRetryable,
        TurnInProgress,
        HandoffOpen,
        AgentPaused,
        FeatureNotEnabled,
        RateLimited,
        TooManyActiveTurns,
        DailyCapReached,
    ),
)
async def retry_turn(
    session_id: str,
    turn_id: str,
    user: CurrentUser,
    db: DbSession,
    settings: AppSettings,
    temporal: Temporal,
    one_statement: AutocommitSessions,
    background: BackgroundTasks,
) -> TurnStarted:
    """Answer the same message again; the new answer replaces the incomplete or cancelled one,
    reusing the tool results already stored."""
    retried = await retries.retry_turn(
        db, owner=user, session_id=session_id, turn_id=turn_id, limits=settings.limits
    )
    await db.commit()  # the new turn (the start outbox) before its start
    assert retried.turn is not None  # a retry always opens a turn
    await _start(temporal, one_statement, settings, retried.turn, background)
    return TurnStarted.build(
        session_id=session_id,
        turn_id=retried.turn.id,
        state=retried.turn.state,
        message=retried.message,
    )


@router.get(
    "/turns/{turn_id}/events",
    response_class=EventSourceResponse,
    responses={
        200: {
            "model": TurnStreamEvent,
            "description": "One frame per event (api.md)",
            "content": {"text/event-stream": {}},
        },
        **answers(RateLimited),
    },
)
async def stream_events(
    session_id: str,
    turn_id: str,
    db: DbSession,
    one_statement: AutocommitSessions,
    user: CurrentUser,
    hub: Hub,
    registry: Streams,
    settings: AppSettings,
    last_event_id: LastEventId = None,
    after: After = None,
) -> EventSourceResponse:
    """Server-sent events of the turn: replay after `Last-Event-ID` (or `?after=`), then live."""
    start = resume_after(last_event_id, after)
    # 404 for a turn that is not the caller's, 429 at the limit, both before the stream starts.
    lease = await registry.reserve(db, user, session_id, turn_id)
    await db.close()  # the stream may run for minutes; do not hold a pooled connection

    viewer, finished = Viewer(), False  # the stream attaches with its first read

    def release() -> None:  # when the response is done, whether or not the stream began
        registry.release(lease, turn_id if viewer.attached else None, hung_up=not finished)

    async def events() -> AsyncGenerator[bytes, None]:
        nonlocal finished
        # Frames known together go out as one body chunk: the `retry:` frame with the first
        # read's events, then each batch the log or the doorbell brings.
        lead = ServerSentEvent(retry=settings.stream_retry_ms).encode()
        async for batch in turn_event_batches(
            hub=hub, sessions=one_statement, turn_id=turn_id, after=start, viewer=viewer
        ):
            yield lead + b"".join(frame.encode() for frame in batch)
            lead = b""
        finished = True  # a terminal event, or the turn rests awaiting a confirmation

    return live_response(events(), settings, on_close=release)
