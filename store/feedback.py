"""Ratings of answers, linked to the run that produced them, and the operators' read of them.

One rating per user and message; a second replaces the first. Nothing here commits.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession

from parley.errors import InvalidRequest, NotFound
from parley.store.identity import Identity
from parley.store.models import Feedback, Message, TraceSpan
from parley.store.rows import typed_row
from parley.store.sessions import get_session
from parley.store.usage import Span


@dataclass(frozen=True)
class Rating:
    """A user's rating of an answer, and the run (turn) that produced the answer."""

    message_id: str
    user_id: str
    session_id: str
    turn_id: str | None
    rating: str
    comment: str | None
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True)
class RatedAnswer:
    feedback: Rating
    answer_text: str
    trace: list[Span]


async def rate_message(
    db: AsyncSession,
    *,
    owner: Identity,
    session_id: str,
    message_id: str,
    rating: str,
    comment: str | None,
) -> Rating:
    """Store (or replace) the owner's rating of an assistant message of their session."""
    await get_session(db, owner=owner, session_id=session_id)
    message = await db.scalar(
        select(Message).where(Message.id == message_id, Message.session_id == session_id)
    )
    if message is None:
        raise NotFound("message not found")
    if message.role != "assistant":
        raise InvalidRequest("only an assistant's answer can be rated", field="message_id")
    values = {
        "message_id": message.id,
        "tenant_id": owner.tenant_id,
        "user_id": owner.user_id,
        "session_id": session_id,
        # The run that produced this answer: its steps are its trace spans.
        "turn_id": message.turn_id,
        "rating": rating,
        "comment": comment,
    }
    row = await db.scalar(
        insert(Feedback)
        .values(**values)
        .on_conflict_do_update(
            index_elements=[Feedback.message_id, Feedback.tenant_id, Feedback.user_id],
            set_={"rating": rating, "comment": comment, "updated_at": func.now()},
        )
        .returning(Feedback)
        .execution_options(populate_existing=True)
    )
    assert row is not None
    return typed_row(Rating, row)


async def recent_ratings(
    db: AsyncSession, *, tenant_id: str, rating: str = "down", limit: int = 50
) -> list[RatedAnswer]:
    """A tenant's latest ratings of one kind, newest first, each with the answer and the
    trace spans of the run that produced it."""
    rows = list(
        await db.execute(
            select(Feedback, Message.text)
            .join(Message, Message.id == Feedback.message_id)
            .where(Feedback.tenant_id == tenant_id, Feedback.rating == rating)
            .order_by(Feedback.updated_at.desc())
            .limit(limit)
        )
    )
    turn_ids = {f.turn_id for f, _ in rows if f.turn_id}
    spans: dict[str, list[Span]] = {}
    if turn_ids:
        for span in await db.scalars(
            select(TraceSpan)
            .where(TraceSpan.turn_id.in_(turn_ids))
            .order_by(TraceSpan.started_at, TraceSpan.id)
        ):
            spans.setdefault(span.turn_id, []).append(typed_row(Span, span))
    return [
        RatedAnswer(typed_row(Rating, f), text, spans.get(f.turn_id or "", [])) for f, text in rows
    ]
