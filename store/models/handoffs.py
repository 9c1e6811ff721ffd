"""Hand-offs to a person (store/handoffs.py): the case, its internal notes and its event log."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import DateTime, ForeignKey, Index, Integer, String, Text, text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from parley.store.models.core import Base, now_column

# An open case (as store/handoffs.py spells it): it holds its session.
OPEN = "status IN ('waiting', 'claimed')"


class Handoff(Base):
    """One escalation to a person: opened by the model's `handoff_to_human` call, the
    customer's own words or a tenant's policy (parley/handoff_rules.py), worked by
    a support agent of the session's tenant, run by its workflow (workflows/handoff.py)."""

    __tablename__ = "handoffs"
    __table_args__ = (
        # At most one open case per session: while it is open, it owns the conversation.
        Index("uq_handoffs_open_session", "session_id", unique=True, postgresql_where=text(OPEN)),
        # The inbox's order: the highest priority first, then the oldest.
        Index(
            "ix_handoffs_inbox",
            "tenant_id",
            text("priority DESC"),
            "created_at",
            postgresql_where=text(OPEN),
        ),
    )

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    session_id: Mapped[str] = mapped_column(ForeignKey("sessions.id"))
    # The turn that opened it; None when the customer asked for a person in a message that
    # started no turn (store/posting.py).
    turn_id: Mapped[str | None] = mapped_column(ForeignKey("turns.id"))
    # What opened it: `tool`, `user_asked` or `policy` (parley/handoff_rules.py `OpenedBy`).
    opened_by: Mapped[str] = mapped_column(String(16), server_default="tool")
    # The customer whose conversation it is (the session's owner).
    tenant_id: Mapped[str] = mapped_column(String(64))
    user_id: Mapped[str] = mapped_column(String(64))
    reason: Mapped[str] = mapped_column(Text)
    # waiting -> claimed -> resolved | handed_back (parley/handoffs.py `HandoffStatus`).
    status: Mapped[str] = mapped_column(String(16), server_default="waiting")
    # Higher first in the inbox, then the oldest.
    priority: Mapped[int] = mapped_column(Integer, server_default="0")
    # The case summary written for the person, and who wrote it: `model` or `code`.
    summary: Mapped[str | None] = mapped_column(Text)
    summary_by: Mapped[str | None] = mapped_column(String(16))
    # The agent holding it, with the name the customer sees.
    agent_id: Mapped[str | None] = mapped_column(String(64))
    agent_name: Mapped[str | None] = mapped_column(String(200))
    claimed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # When the customer was told the team is away and when a person is back (once).
    away_told_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # When the customer was told nobody had claimed it in time (once).
    unclaimed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    ended_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # The counter of the case's event log (as a turn's is of its own).
    last_event_id: Mapped[int] = mapped_column(Integer, server_default="0")
    created_at: Mapped[datetime] = now_column()


class HandoffNote(Base):
    """An agent's internal note: read by agents only, never in the customer's stream,
    messages or export."""

    __tablename__ = "handoff_notes"
    __table_args__ = (Index("ix_handoff_notes_handoff", "handoff_id"),)

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    handoff_id: Mapped[str] = mapped_column(ForeignKey("handoffs.id"))
    agent_id: Mapped[str] = mapped_column(String(64))
    agent_name: Mapped[str] = mapped_column(String(200))
    text: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = now_column()


class HandoffEvent(Base):
    """The case's event log: what the customer's and the agent's streams replay by id."""

    __tablename__ = "handoff_events"

    handoff_id: Mapped[str] = mapped_column(ForeignKey("handoffs.id"), primary_key=True)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    type: Mapped[str] = mapped_column(String(32))
    data: Mapped[dict[str, Any]] = mapped_column(JSONB)
    created_at: Mapped[datetime] = now_column()


class WebhookDelivery(Base):
    """The delivery log of a tenant's webhook (parley/webhooks.py): one row per case and
    event (or budget event), its id the receiver's idempotency key, its payload the bytes
    every attempt sends."""

    __tablename__ = "webhook_deliveries"
    __table_args__ = (Index("ix_webhook_deliveries_tenant", "tenant_id", "created_at"),)

    id: Mapped[str] = mapped_column(String(120), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(String(64))
    # Whose words the payload may hold; None for a budget event (parley/webhooks.py).
    session_id: Mapped[str | None] = mapped_column(String(40))
    handoff_id: Mapped[str | None] = mapped_column(ForeignKey("handoffs.id"))
    event: Mapped[str] = mapped_column(String(16))
    url: Mapped[str] = mapped_column(String(500))
    payload: Mapped[dict[str, Any]] = mapped_column(JSONB)
    # pending -> delivered | refused (the egress rules) | failed (attempts spent)
    status: Mapped[str] = mapped_column(String(16))
    attempts: Mapped[int] = mapped_column(Integer, server_default="0")
    last_status_code: Mapped[int | None] = mapped_column(Integer)
    last_error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = now_column()
    delivered_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
