"""Ratings of answers, linked to the run that produced them, and the operators' read of them.

One rating per user and message; a second replaces the first. Nothing here commits.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from datetime import datetime

from parley.errors import InvalidRequest, NotFound
from parley.store.db import Db
from parley.store.identity import Identity
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
    db: Db,
    *,
    owner: Identity,
    session_id: str,
    message_id: str,
    rating: str,
    comment: str | None,
) -> Rating:
    """Store (or replace) the owner's rating of an assistant message of their session."""
    await get_session(db, owner=owner, session_id=session_id)
    message = await db.row(_MESSAGE, {"id": message_id, "session_id": session_id}, _Rated)
    if message is None:
        raise NotFound("message not found")
    if message.role != "assistant":
        raise InvalidRequest("only an assistant's answer can be rated", field="message_id")
    params = {
        "message_id": message_id,
        "tenant_id": owner.tenant_id,
        "user_id": owner.user_id,
        "session_id": session_id,
        # The run that produced this answer: its steps are its trace spans.
        "turn_id": message.turn_id,
        "rating": rating,
        "comment": comment,
    }
    row = await db.row(_RATE, params, Rating)
    assert row is not None
    return row


@dataclass(frozen=True)
class _Rated:
    role: str
    turn_id: str | None


_MESSAGE = "SELECT role, turn_id FROM messages WHERE id = %(id)s AND session_id = %(session_id)s"
_RATING_COLUMNS = (
    "message_id, user_id, session_id, turn_id, rating, comment, created_at, updated_at"
)
_RATE = f"""
    INSERT INTO feedback (message_id, tenant_id, user_id, session_id, turn_id, rating, comment)
    VALUES (%(message_id)s, %(tenant_id)s, %(user_id)s, %(session_id)s, %(turn_id)s,
        %(rating)s, %(comment)s)
    ON CONFLICT (message_id, tenant_id, user_id) DO UPDATE
        SET rating = excluded.rating, comment = excluded.comment, updated_at = now()
    RETURNING {_RATING_COLUMNS}
"""


async def recent_ratings(
    db: Db, *, tenant_id: str, rating: str = "down", limit: int = 50
) -> list[RatedAnswer]:
    """A tenant's latest ratings of one kind, newest first, each with the answer and the
    trace spans of the run that produced it."""
    params = {"tenant_id": tenant_id, "rating": rating, "limit": limit}
    rows = await db.rows(_RECENT, params, _RatedRow)
    turn_ids = sorted({r.turn_id for r in rows if r.turn_id})
    spans: dict[str, list[Span]] = {}
    if turn_ids:
        for span in await db.rows(_SPANS, {"turn_ids": turn_ids}, _TurnSpan):
            spans.setdefault(span.turn_id, []).append(span.span())
    return [
        RatedAnswer(r.rating_row(), r.answer_text, spans.get(r.turn_id or "", [])) for r in rows
    ]


@dataclass(frozen=True)
class _RatedRow(Rating):
    """A rating and the text of the answer it rates."""

    answer_text: str = ""

    def rating_row(self) -> Rating:
        return Rating(**{f.name: getattr(self, f.name) for f in fields(Rating)})


_RECENT = f"""
    SELECT {", ".join("f." + c for c in _RATING_COLUMNS.split(", "))}, m.text AS answer_text
    FROM feedback AS f JOIN messages AS m ON m.id = f.message_id
    WHERE f.tenant_id = %(tenant_id)s AND f.rating = %(rating)s
    ORDER BY f.updated_at DESC LIMIT %(limit)s
"""


@dataclass(frozen=True)
class _TurnSpan(Span):
    turn_id: str = ""

    def span(self) -> Span:
        return Span(**{f.name: getattr(self, f.name) for f in fields(Span)})


_SPANS = """
    SELECT turn_id, name, attempt, started_at, ended_at, outcome, attrs FROM trace_spans
    WHERE turn_id = ANY(%(turn_ids)s) ORDER BY started_at, id
"""
