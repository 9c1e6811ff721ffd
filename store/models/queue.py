"""A message posted while its session's turn runs: it waits here, outside the conversation,
until that turn ends (store/queue.py)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import ForeignKey, String, Text, UniqueConstraint
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from parley.store.models.core import Base, now_column


class QueuedMessage(Base):
    """The text of a queued turn's message. It takes its seq (joins `messages`) only when the
    turn starts, so the running turn's prompts never see it and the transcript stays in the
    order the model answered it. At most one per session."""

    __tablename__ = "queued_messages"
    __table_args__ = (UniqueConstraint("session_id", name="uq_queued_messages_session"),)

    turn_id: Mapped[str] = mapped_column(ForeignKey("turns.id"), primary_key=True)
    session_id: Mapped[str] = mapped_column(ForeignKey("sessions.id"))
    # The id the message will have in `messages` (the turn names it from the start).
    message_id: Mapped[str] = mapped_column(String(40))
    client_message_id: Mapped[str] = mapped_column(String(64))
    text: Mapped[str] = mapped_column(Text)
    file_ids: Mapped[list[str] | None] = mapped_column(JSONB)
    # The task queue of the API that queued it: the ring that promotes the turn names it.
    task_queue: Mapped[str | None] = mapped_column(String(200))
    # The trace context of the POST that queued it (W3C traceparent; null without tracing):
    # the promoted turn's start joins that trace.
    trace: Mapped[str | None] = mapped_column(String(200))
    created_at: Mapped[datetime] = now_column()
