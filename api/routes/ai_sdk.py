"""The AI SDK's chat protocol over Parley's turns: what `useChat` and the `ai` package's
`DefaultChatTransport` send and read (parley/ai_sdk.py; docs/features/ai-sdk.md).

The chat's id is a Parley session of the caller (`POST /v1/sessions` makes one; any other id
is a 404): the server keeps the history, so of the messages the client sends only the last
is read. A user message is posted under its own id as the `client_message_id` (a resend
answers its turn again, it starts none); an assistant message whose approvals the user
answered confirms or declines those actions, and the stream continues the turn that waited.

The transport's Stop only closes the connection (ai 7.0.185 `Chat.stop` aborts the fetch and
sends nothing). So a chat stream that closes before its turn has ended or come to rest is
taken as a Stop unless a stream of the turn comes back (the resume GET after a reload)
within `ai_sdk_stop_grace_s`: then the turn is cancelled, as `POST .../cancel` would.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, AsyncIterator

from fastapi import APIRouter, BackgroundTasks, Response
from sse_starlette import EventSourceResponse

from parley.ai_sdk import (
    DONE_FRAME,
    STREAM_HEADERS,
    ChatRequestIn,
    Chunk,
    TurnChunks,
    UIStreamFrame,
    approval_answers,
    message_text,
    resting_end,
)
from parley.api.deps import (
    AppSettings,
    AutocommitSessions,
    CurrentUser,
    DbSession,
    Hub,
    Streams,
    Temporal,
    TemporalConnector,
)
from parley.api.errors import answers
from parley.api.posting import answer_card, post
from parley.api.schemas import PostMessageIn, TurnStarted
from parley.api.sse import TurnEventResponse, live_response
from parley.api.streaming import (
    EventHub,
    StreamRegistry,
    Viewer,
    stored_event_batches,
)
from parley.config import Settings
from parley.errors import (
    ActionChanged,
    ActionExpired,
    ActionResolved,
    ActionSuperseded,
    AgentPaused,
    DailyCapReached,
    FeatureNotEnabled,
    IdempotencyKeyReused,
    InvalidRequest,
    NotFound,
    RateLimited,
    StaleView,
    TooManyActiveTurns,
    TurnInProgress,
)
from parley.statuses import Decision
from parley.store import actions
from parley.store import sessions as store_sessions
from parley.store.db import Database, Db
from parley.store.identity import Identity

router = APIRouter(prefix="/v1/ai-sdk", tags=["ai-sdk"], responses=answers(NotFound))

_STREAM = {
    "model": UIStreamFrame,
    "description": "The UI message stream (SSE, one JSON chunk a frame, then `[DONE]`)",
    "content": {"text/event-stream": {}},
}


@router.post(
    "/chat",
    response_class=EventSourceResponse,
    responses={
        200: _STREAM,
        **answers(
            InvalidRequest,
            StaleView,
            TurnInProgress,
            IdempotencyKeyReused,
            AgentPaused,
            FeatureNotEnabled,
            RateLimited,
            TooManyActiveTurns,
            DailyCapReached,
            ActionResolved,
            ActionSuperseded,
            ActionExpired,
            ActionChanged,
        ),
    },
)
async def chat(
    body: ChatRequestIn,
    db: DbSession,
    one_statement: AutocommitSessions,
    user: CurrentUser,
    temporal: Temporal,
    settings: AppSettings,
    hub: Hub,
    registry: Streams,
) -> TurnEventResponse:
    """The AI SDK's chat request: the last message is the user's new message (its id is its
    `client_message_id`) or their answers to the turn's approval requests; the response is
    that turn's UI message stream."""
    await store_sessions.get_session(db, owner=user, session_id=body.id)
    last = body.messages[-1]
    background = BackgroundTasks()
    continue_after: str | None = None  # the card whose answer this stream continues from
    if last.role == "user":
        text = message_text(last)
        if not text:
            raise InvalidRequest("messages: the last message has no text", field="messages")
        message = PostMessageIn(client_message_id=last.id, text=text)
        posted = await post(
            body.id, message, db, one_statement, user, temporal, settings, background
        )
        if posted.started.turn_id is None:  # a person of the support team holds the session
            return _held(posted.started)
        turn_id = posted.started.turn_id
    elif last.role == "assistant" and (answered := approval_answers(last)):
        turn_id, continue_after = await _answer_cards(
            body.id, answered, db, user, temporal, one_statement
        )
    else:
        raise InvalidRequest(
            "messages: the last message is neither a user message nor answered approvals",
            field="messages",
        )
    return await _turn_stream(
        db=db,
        one_statement=one_statement,
        user_owner=user,
        session_id=body.id,
        turn_id=turn_id,
        hub=hub,
        registry=registry,
        settings=settings,
        background=background,
        continue_after=continue_after,
    )


@router.get(
    "/chat/{session_id}/stream",
    response_class=EventSourceResponse,
    responses={200: _STREAM, 204: {"description": "No turn is running: nothing to resume"}},
)
async def resume_chat(
    session_id: str,
    db: DbSession,
    one_statement: AutocommitSessions,
    user: CurrentUser,
    hub: Hub,
    registry: Streams,
    settings: AppSettings,
) -> Response:
    """The AI SDK's resume request: the session's running turn as a whole UI message (a
    replay from its start, then live), or `204` when no turn is running."""
    session = await store_sessions.get_session(db, owner=user, session_id=session_id)
    if session.active_turn_id is None:
        return Response(status_code=204)
    return await _turn_stream(
        db=db,
        one_statement=one_statement,
        user_owner=user,
        session_id=session_id,
        turn_id=session.active_turn_id,
        hub=hub,
        registry=registry,
        settings=settings,
        background=None,
        continue_after=None,
    )


async def _turn_stream(
    *,
    db: Db,
    one_statement: Database,
    user_owner: Identity,
    session_id: str,
    turn_id: str,
    hub: EventHub,
    registry: StreamRegistry,
    settings: Settings,
    background: BackgroundTasks | None,
    continue_after: str | None,
) -> TurnEventResponse:
    # 404 for a turn that is not the caller's, 429 at the limit, both before the stream starts.
    lease = await registry.reserve(db, user_owner, session_id, turn_id)
    await db.close()  # the stream may run for minutes; do not hold a pooled connection
    viewer, finished = Viewer(), False

    def release() -> None:
        attached = turn_id if viewer.attached else None
        grace_s = settings.ai_sdk_stop_grace_s
        registry.release(lease, attached, hung_up=not finished, grace_s=grace_s)

    async def frames() -> AsyncGenerator[bytes, None]:
        nonlocal finished
        if background is not None:
            await background()  # the post's bookkeeping (the turn marked started)
        async for frame in _chunks(hub, one_statement, session_id, turn_id, viewer, continue_after):
            yield frame
        finished = True

    return live_response(frames(), settings, on_close=release, headers=STREAM_HEADERS)


async def _chunks(
    hub: EventHub,
    one_statement: Database,
    session_id: str,
    turn_id: str,
    viewer: Viewer,
    continue_after: str | None,
) -> AsyncIterator[bytes]:
    """The turn's UI message stream: `start`, its events' chunks, the finish and `[DONE]`.
    Continuing after a card, the events up to that card are read but not sent again (the
    client holds them): the translation still sees them, so its steps and parts line up."""
    chunks = TurnChunks(session_id=session_id, turn_id=turn_id)
    lead = _encode(chunks.start())
    skipping = continue_after is not None
    last_type: str | None = None
    async for batch in stored_event_batches(
        hub=hub, sessions=one_statement, turn_id=turn_id, after=0, viewer=viewer
    ):
        out: list[Chunk] = []
        for event in batch:
            made = chunks.event(event.type, event.data)
            last_type = event.type
            if skipping:
                card = event.data.get("action") or {}
                if event.type == "confirmation_required" and card.get("id") == continue_after:
                    skipping = False
                continue
            out += made
        if out or lead:
            yield lead + _encode(out)
            lead = b""
    yield _encode(chunks.end(resting_end(last_type) or "other")) + DONE_FRAME


async def _answer_cards(
    session_id: str,
    answered: list[tuple[str, bool]],
    db: Db,
    user: Identity,
    temporal: TemporalConnector,
    one_statement: Database,
) -> tuple[str, str]:
    """Confirm or decline each answered card as `POST .../actions/{id}/confirm|decline`
    would; the turn to stream and the card it continues after."""
    for action_id, approved in answered:
        decision = Decision.confirmed if approved else Decision.declined
        try:
            await answer_card(session_id, action_id, decision, db, user, temporal, one_statement)
        except ActionResolved:
            pass  # the same answer again (a resend): its turn is streamed as it went on
    action = await actions.get_action(db, action_id=answered[-1][0])
    if action is None:
        raise NotFound("action not found")
    return action.turn_id, action.id


def _held(started: TurnStarted) -> TurnEventResponse:
    """The answer while a person of the support team holds the session: no turn runs; the
    message went to them (a `data-handoff` part says so)."""
    handoff = {"handoff_id": started.handoff_id, "message_id": started.message.id}
    chunks: list[Chunk] = [
        {"type": "start"},
        {"type": "data-handoff", "data": handoff},
        {"type": "finish", "finishReason": "other"},
    ]

    async def frames() -> AsyncIterator[bytes]:
        yield _encode(chunks) + DONE_FRAME

    return TurnEventResponse(frames(), headers=STREAM_HEADERS)


def _encode(chunks: list[Chunk]) -> bytes:
    return b"".join(
        b"data: " + json.dumps(c, separators=(",", ":")).encode() + b"\n\n" for c in chunks
    )
