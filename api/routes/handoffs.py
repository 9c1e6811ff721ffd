"""Hand-offs to a person: the agent inbox (`/v1/handoffs`, role `agent`) and the customer's
view of their case (`/v1/sessions/{session_id}/handoff`). The rules: parley/handoffs.py."""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator
from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, Field, field_validator
from sse_starlette import EventSourceResponse, ServerSentEvent

from parley.api.case_stream import case_event_stream
from parley.api.deps import (
    After,
    AppSettings,
    AutocommitSessions,
    CurrentUser,
    DbSession,
    Hub,
    LastEventId,
    Streams,
    Temporal,
    resume_after,
)
from parley.api.errors import answers
from parley.api.metrics import HANDOFF_CLAIM_SECONDS, HANDOFF_OPEN_SECONDS
from parley.api.schemas import NO_NUL
from parley.api.sse import live_response
from parley.api.streaming import StreamRegistry
from parley.dispatch.handoffs import tell_handoff
from parley.errors import Forbidden, HandoffClaimed, HandoffClosed, NotFound, RateLimited
from parley.handoffs import HandoffChange, HandoffStatus, HandoffView
from parley.store import handoffs as store
from parley.store.sessions import get_session
from parley.wire import MessageView, Timestamp

log = logging.getLogger(__name__)

router = APIRouter(tags=["handoffs"])
# The agent inbox, under /v1/handoffs; the customer's side, under their session.
INBOX = "/v1/handoffs"
SESSION = "/v1/sessions/{session_id}"
ANY_MOVE = answers(Forbidden, NotFound, HandoffClaimed, HandoffClosed)


class HandoffList(BaseModel):
    handoffs: list[HandoffView]


class NoteView(BaseModel):
    """An internal note: agents only."""

    id: str
    agent_name: str
    text: str
    created_at: Timestamp


class HandoffDetail(BaseModel):
    """A case with its summary, its conversation (as the customer sees it) and its notes."""

    handoff: HandoffView
    messages: list[MessageView]
    notes: list[NoteView]


class HandoffOut(BaseModel):
    handoff: HandoffView


class TextIn(BaseModel):
    text: str = Field(min_length=1, max_length=8000, json_schema_extra={"pattern": NO_NUL})

    @field_validator("text")
    @classmethod
    def _no_nul(cls, value: str) -> str:
        if "\x00" in value:
            raise ValueError("must not contain NUL characters")
        return value


class MessageOut(BaseModel):
    message: MessageView


class NoteOut(BaseModel):
    note: NoteView


def _view(case: store.HandoffRow) -> HandoffView:
    return HandoffView.model_validate(case, from_attributes=True)


@router.get(INBOX, responses=answers(Forbidden))
async def list_handoffs(db: DbSession, user: CurrentUser) -> HandoffList:
    """The tenant's open hand-offs, highest priority first, then the oldest (role `agent`)."""
    cases = await store.inbox(db, agent=user)
    return HandoffList(handoffs=[_view(case) for case in cases])


@router.get(INBOX + "/{handoff_id}", responses=answers(Forbidden, NotFound))
async def read_handoff(handoff_id: str, db: DbSession, user: CurrentUser) -> HandoffDetail:
    """One hand-off with its case summary, its conversation and its internal notes."""
    case = await store.case_for_agent(db, agent=user, handoff_id=handoff_id)
    messages = await store.conversation(db, session_id=case.session_id)
    notes = await store.notes(db, handoff_id=case.id)
    return HandoffDetail(
        handoff=_view(case),
        messages=messages,
        notes=[NoteView.model_validate(n, from_attributes=True) for n in notes],
    )


@router.post(INBOX + "/{handoff_id}/claim", responses=ANY_MOVE)
async def claim_handoff(
    handoff_id: str, db: DbSession, user: CurrentUser, temporal: Temporal
) -> HandoffOut:
    """Take the hand-off: one holder at a time (a second claim is 409 `handoff_claimed`)."""
    case = await store.claim(db, agent=user, handoff_id=handoff_id)
    await db.commit()
    if case.claimed_at is not None:
        HANDOFF_CLAIM_SECONDS.observe((case.claimed_at - case.created_at).total_seconds())
    await _tell(temporal, case)
    return HandoffOut(handoff=_view(case))


@router.post(INBOX + "/{handoff_id}/messages", status_code=201, responses=ANY_MOVE)
async def reply_to_handoff(
    handoff_id: str, body: TextIn, db: DbSession, user: CurrentUser
) -> MessageOut:
    """Reply to the customer, in their conversation, under the holder's name (holder only)."""
    message = await store.reply(db, agent=user, handoff_id=handoff_id, text=body.text)
    await db.commit()
    return MessageOut(message=message)


@router.post(INBOX + "/{handoff_id}/notes", status_code=201, responses=answers(Forbidden, NotFound))
async def add_handoff_note(
    handoff_id: str, body: TextIn, db: DbSession, user: CurrentUser
) -> NoteOut:
    """An internal note on the hand-off: agents read it, the customer never does."""
    note = await store.add_note(db, agent=user, handoff_id=handoff_id, text=body.text)
    await db.commit()
    return NoteOut(note=NoteView.model_validate(note, from_attributes=True))


@router.post(INBOX + "/{handoff_id}/resolve", responses=ANY_MOVE)
async def resolve_handoff(
    handoff_id: str, db: DbSession, user: CurrentUser, temporal: Temporal
) -> HandoffOut:
    """Close the case as resolved (holder only); the assistant answers the next message."""
    return await _end(db, user, temporal, handoff_id, HandoffStatus.resolved)


@router.post(INBOX + "/{handoff_id}/hand-back", responses=ANY_MOVE)
async def hand_back(
    handoff_id: str, db: DbSession, user: CurrentUser, temporal: Temporal
) -> HandoffOut:
    """Hand the conversation back to the assistant (holder only): its next prompt holds the
    exchange with the person."""
    return await _end(db, user, temporal, handoff_id, HandoffStatus.handed_back)


async def _end(
    db: DbSession, user: CurrentUser, temporal: Temporal, handoff_id: str, to: HandoffStatus
) -> HandoffOut:
    case = await store.end(db, agent=user, handoff_id=handoff_id, status=to)
    await db.commit()
    if case.ended_at is not None:
        open_for = case.ended_at - case.created_at
        HANDOFF_OPEN_SECONDS.labels(to.value).observe(open_for.total_seconds())
    await _tell(temporal, case)
    return HandoffOut(handoff=_view(case))


async def _tell(temporal: Temporal, case: store.HandoffRow) -> None:
    """The case's run hears of the committed change; if Temporal is away it asks the store
    at its next timeout instead (workflows/handoff.py)."""
    try:
        client = await temporal.get()
    except Exception:
        log.warning("Temporal is away: hand-off %s was not told of %s", case.id, case.status)
        return
    await tell_handoff(
        client, session_id=case.session_id, change=HandoffChange(case.id, case.status)
    )


_STREAM_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "One frame per event of the case (api.md)",
        "content": {"text/event-stream": {}},
    }
}


@router.get(
    INBOX + "/{handoff_id}/events",
    response_class=EventSourceResponse,
    responses={**_STREAM_RESPONSES, **answers(Forbidden, NotFound, RateLimited)},
)
async def agent_case_events(
    handoff_id: str,
    db: DbSession,
    user: CurrentUser,
    hub: Hub,
    registry: Streams,
    one_statement: AutocommitSessions,
    settings: AppSettings,
    last_event_id: LastEventId = None,
    after: After = None,
) -> EventSourceResponse:
    """Server-sent events of the hand-off, for its agents: replay, then live until it ends."""
    case = await store.case_for_agent(db, agent=user, handoff_id=handoff_id)
    lease = await registry.reserve_case(db, user)  # 429 at the user's stream limit
    await db.close()
    start = resume_after(last_event_id, after)
    return _stream(hub, one_statement, settings, case.id, start, (registry, lease))


def _stream(
    hub: Hub,
    sessions: AutocommitSessions,
    settings: AppSettings,
    handoff_id: str,
    after: int,
    held: tuple[StreamRegistry, str],
) -> EventSourceResponse:
    """The case's stream, counted among the user's open streams while it lasts (`held`: the
    registry and its lease)."""
    registry, lease = held

    def release() -> None:  # when the response is done, whether or not the stream began
        registry.release(lease, None, hung_up=False)

    async def frames() -> AsyncGenerator[ServerSentEvent, None]:
        yield ServerSentEvent(retry=settings.stream_retry_ms)
        async for frame in case_event_stream(
            hub=hub, sessions=sessions, handoff_id=handoff_id, after=after
        ):
            yield frame

    return live_response(frames(), settings, on_close=release)


# The customer's side: their session's case.


class CustomerCase(BaseModel):
    """The session's latest hand-off as its customer sees it: who holds it, never the notes
    or the summary; `events_url` streams it while it is open."""

    id: str
    status: str
    agent_name: str | None
    unclaimed: bool
    events_url: str


@router.get(SESSION + "/handoff", responses=answers(NotFound))
async def session_handoff(session_id: str, db: DbSession, user: CurrentUser) -> CustomerCase:
    """The session's latest hand-off to a person (404 if it never had one)."""
    await get_session(db, owner=user, session_id=session_id)
    case = await store.latest_case(db, session_id=session_id)
    if case is None:
        raise NotFound("this session was never handed to a person")
    return CustomerCase(
        id=case.id,
        status=case.status,
        agent_name=case.agent_name,
        unclaimed=case.unclaimed_at is not None,
        events_url=f"/v1/sessions/{session_id}/handoffs/{case.id}/events",
    )


@router.get(
    SESSION + "/handoffs/{handoff_id}/events",
    response_class=EventSourceResponse,
    responses={**_STREAM_RESPONSES, **answers(NotFound, RateLimited)},
)
async def customer_case_events(
    session_id: str,
    handoff_id: str,
    db: DbSession,
    user: CurrentUser,
    hub: Hub,
    registry: Streams,
    one_statement: AutocommitSessions,
    settings: AppSettings,
    last_event_id: LastEventId = None,
    after: After = None,
) -> EventSourceResponse:
    """Server-sent events of the session's hand-off: the person joining, their replies, the
    end; replay after `Last-Event-ID` (or `?after=`), then live."""
    await get_session(db, owner=user, session_id=session_id)
    case = await store.get_case(db, handoff_id=handoff_id)
    if case is None or case.session_id != session_id:
        raise NotFound("no such hand-off")
    lease = await registry.reserve_case(db, user)  # 429 at the user's stream limit
    await db.close()
    start = resume_after(last_event_id, after)
    return _stream(hub, one_statement, settings, case.id, start, (registry, lease))
