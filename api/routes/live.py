"""The session stream: everything that changes a session, live, for every tab and device of
its owner (api/live.py; the contract is parley/live.py and docs/api.md)."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Annotated

from fastapi import APIRouter, Header
from pydantic import WithJsonSchema
from sse_starlette import EventSourceResponse, ServerSentEvent

from parley.api.deps import AppSettings, AutocommitSessions, CurrentUser, DbSession, Hub, Streams
from parley.api.errors import answers
from parley.api.live import SessionStream
from parley.api.sse import live_response
from parley.errors import NotFound, RateLimited
from parley.live import CURSOR_PATTERN, SessionCursor, SessionStreamEvent

router = APIRouter(
    prefix="/v1/sessions/{session_id}", tags=["sessions"], responses=answers(NotFound)
)


@router.get(
    "/stream",
    response_class=EventSourceResponse,
    responses={
        200: {
            "model": SessionStreamEvent,
            "description": "One frame per session event or turn event (api.md)",
            "content": {"text/event-stream": {}},
        },
        **answers(RateLimited),
    },
)
async def session_stream(
    session_id: str,
    db: DbSession,
    one_statement: AutocommitSessions,
    user: CurrentUser,
    hub: Hub,
    registry: Streams,
    settings: AppSettings,
    last_event_id: Annotated[
        str | None,
        Header(pattern=CURSOR_PATTERN),
        # Absent, not null: a header has no null to send.
        WithJsonSchema({"type": "string", "pattern": CURSOR_PATTERN}),
    ] = None,
) -> EventSourceResponse:
    """Server-sent events of everything that changes the session (messages from any client,
    every turn's events, deletion), resumable with `Last-Event-ID`; for every tab and device."""
    cursor = SessionCursor.parse(last_event_id) if last_event_id is not None else None
    # 404 for a session that is not the caller's, 429 at the limit, both before it starts.
    lease = await registry.reserve(db, user, session_id, None)
    await db.close()  # the stream may run for hours; do not hold a pooled connection
    stream = SessionStream(hub=hub, sessions=one_statement, session_id=session_id, cursor=cursor)

    def release() -> None:  # when the response is done, whether or not the stream began
        registry.release(lease, None, hung_up=False)

    async def frames() -> AsyncGenerator[bytes, None]:
        lead = ServerSentEvent(retry=settings.stream_retry_ms).encode()
        async for batch in stream.batches():
            yield lead + b"".join(frame.encode() for frame in batch)
            lead = b""

    return live_response(frames(), settings, on_close=release)
