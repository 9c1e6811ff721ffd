"""Erasures and their receipts: the one record that outlives what it deleted."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import DateTime, Float, Index, String
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from parley.store.models.core import Base, now_column


class Erasure(Base):
    """One erasure (of a user, or of one deleted session) and, once done, its receipt.

    The subject's ids in clear (`user_id`, `session_id`) are kept only while it runs, for the
    workflow's steps to find the rows; the last step clears them. What stays is the receipt:
    the scope, the tenant, a keyed hash of the subject (parley/erasure.py `subject_hash`),
    the times and the rows deleted per table. No text, no user id.
    """

    __tablename__ = "erasures"
    __table_args__ = (
        Index("ix_erasures_subject", "subject_hash"),
        # The start sweep looks only at erasures whose workflow start was not confirmed.
        Index(
            "ix_erasures_unstarted", "requested_at", postgresql_where="workflow_started_at IS NULL"
        ),
    )

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    scope: Mapped[str] = mapped_column(String(16))
    tenant_id: Mapped[str] = mapped_column(String(64))
    subject_hash: Mapped[str] = mapped_column(String(64))
    # While running only: cleared by the last step.
    user_id: Mapped[str | None] = mapped_column(String(64))
    session_id: Mapped[str | None] = mapped_column(String(40))
    status: Mapped[str] = mapped_column(String(16))
    # How long the workflow waits before erasing (a deleted session's grace period).
    grace_s: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")
    # {table: rows deleted}, added to in the transaction of each batch, so a resumed run
    # counts every row once.
    counts: Mapped[dict[str, int]] = mapped_column(JSONB, default=dict, server_default="{}")
    requested_at: Mapped[datetime] = now_column()
    workflow_started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
