"""Ratings of answers: the user's rating, and the operators' list of recent negative ones."""

from __future__ import annotations

from fastapi import APIRouter, Query

from parley.api.deps import Admin, CurrentUser, DbSession
from parley.api.errors import answers
from parley.api.schemas import FeedbackIn, FeedbackList, FeedbackOut, RatedAnswerOut, TraceSpanOut
from parley.errors import Forbidden, InvalidRequest, NotFound
from parley.store import feedback

router = APIRouter(tags=["feedback"])


@router.post(
    "/v1/sessions/{session_id}/messages/{message_id}/feedback",
    status_code=201,
    responses=answers(NotFound, InvalidRequest),
)
async def rate_answer(
    session_id: str, message_id: str, body: FeedbackIn, db: DbSession, user: CurrentUser
) -> FeedbackOut:
    """Rate an answer up or down, with an optional comment; a second rating replaces the
    first. It is linked to the run that produced the answer."""
    row = await feedback.rate_message(
        db,
        owner=user,
        session_id=session_id,
        message_id=message_id,
        rating=body.rating,
        comment=body.comment,
    )
    await db.commit()
    return FeedbackOut.from_row(row)


@router.get(
    "/v1/admin/tenants/{tenant_id}/feedback",
    tags=["admin"],
    responses=answers(Forbidden, NotFound),
)
async def recent_feedback(
    tenant_id: str,
    db: DbSession,
    admin: Admin,
    rating: str = Query("down", pattern="^(up|down)$"),
    limit: int = Query(50, ge=1, le=200),
) -> FeedbackList:
    """The tenant's latest ratings (negative by default), newest first, each with the answer
    and the trace spans of the run that produced it."""
    rated = await feedback.recent_ratings(db, tenant_id=tenant_id, rating=rating, limit=limit)
    return FeedbackList(
        feedback=[
            RatedAnswerOut(
                **FeedbackOut.from_row(r.feedback).model_dump(),
                user_id=r.feedback.user_id,
                session_id=r.feedback.session_id,
                answer_text=r.answer_text,
                trace=[TraceSpanOut.from_row(s) for s in r.trace],
            )
            for r in rated
        ]
    )
