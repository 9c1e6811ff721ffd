"""The session's own event log: what changes a session outside its turns' logs (a message
posted, a turn started, the session deleted), read by the session stream (api/live.py)
beside the event logs of the turns it announces (store/session_events.py)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import ForeignKey, Integer, String
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from parley.store.models.core import Base, now_column


class SessionEvent(Base):
    """One session-level event, numbered from 1 per session by `sessions.last_event_id` (the
    session row's lock orders them). It names the rows it is about instead of copying them:
    a stream reads a `message` event's text from `messages` as it stands, so forgetting or
    erasing the message leaves no copy here."""

    __tablename__ = "session_events"

    session_id: Mapped[str] = mapped_column(ForeignKey("sessions.id"), primary_key=True)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    type: Mapped[str] = mapped_column(String(32))
    # The turn this event announces (the session stream follows its log from here on).
    turn_id: Mapped[str | None] = mapped_column(String(40))
    # The user message it is about, read when the event is sent.
    message_id: Mapped[str | None] = mapped_column(String(40))
    # Anything else, ids and states only (no user's words).
    data: Mapped[dict[str, Any]] = mapped_column(JSONB, default=dict, server_default="{}")
    created_at: Mapped[datetime] = now_column()
