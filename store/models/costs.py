"""The cost ledger and the budgets' spend (parley/costs.py prices; store/costs.py owns both
tables)."""

from __future__ import annotations

from datetime import date, datetime
from decimal import Decimal

from sqlalchemy import (
    Boolean,
    Date,
    DateTime,
    Float,
    Index,
    Integer,
    Numeric,
    String,
    UniqueConstraint,
)
from sqlalchemy.orm import Mapped, mapped_column

from parley.store.models.core import Base, now_column


class ModelCost(Base):
    """One model call's tokens and cost, written once: `key` is the call's own identity (a
    turn's model call id, a summary version), so a retried activity finds its row written.

    Ids, not foreign keys: a row outlives nothing it names except through erasure (the
    catalogue deletes a user's rows with their sessions)."""

    __tablename__ = "model_costs"
    __table_args__ = (
        Index("ix_model_costs_tenant_time", "tenant_id", "created_at"),
        Index("ix_model_costs_turn", "turn_id"),
    )

    # "call:<model_call_id>" | "summary:<summary id>"
    key: Mapped[str] = mapped_column(String(120), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(String(64))
    user_id: Mapped[str | None] = mapped_column(String(64))
    session_id: Mapped[str | None] = mapped_column(String(40))
    turn_id: Mapped[str | None] = mapped_column(String(40))
    # "turn" | "summary" | "specialist"
    kind: Mapped[str] = mapped_column(String(16))
    provider: Mapped[str] = mapped_column(String(32))
    model: Mapped[str] = mapped_column(String(100))
    input_tokens: Mapped[int] = mapped_column(Integer)  # every prompt token, cached included
    cached_tokens: Mapped[int] = mapped_column(Integer)
    cache_write_tokens: Mapped[int] = mapped_column(Integer)
    output_tokens: Mapped[int] = mapped_column(Integer)
    # Parley's own count: the provider reported no usage (a stream cut short, a local server).
    estimated: Mapped[bool] = mapped_column(Boolean)
    # USD, exact; None when no price is known for the model (its tokens are still here).
    cost_usd: Mapped[Decimal | None] = mapped_column(Numeric(20, 10))
    created_at: Mapped[datetime] = now_column()


class BudgetSpend(Base):
    """What one budget's period has spent and holds reserved for calls under way: one row
    per (subject, period, period start), moved only by conditional updates (store/costs.py),
    so concurrent turns cannot together reserve past the budget."""

    __tablename__ = "budget_spend"

    # "tenant:<tenant>" | "user:<tenant>/<user>"
    subject: Mapped[str] = mapped_column(String(140), primary_key=True)
    period: Mapped[str] = mapped_column(String(8), primary_key=True)  # "day" | "month"
    period_start: Mapped[date] = mapped_column(Date, primary_key=True)
    spent_usd: Mapped[Decimal] = mapped_column(Numeric(20, 10), default=0, server_default="0")
    reserved_usd: Mapped[Decimal] = mapped_column(Numeric(20, 10), default=0, server_default="0")
    # The budget as the latest reservation found it (a tenant may change it mid-period).
    limit_usd: Mapped[Decimal] = mapped_column(Numeric(20, 10))


class BudgetHold(Base):
    """One model call's reservation against one budget, until the call settles (its ledger
    row written, the hold deleted and its amount moved from reserved to the real cost). A
    retried attempt finds its call's holds and reserves nothing again."""

    __tablename__ = "budget_holds"

    call_id: Mapped[str] = mapped_column(String(40), primary_key=True)
    subject: Mapped[str] = mapped_column(String(140), primary_key=True)
    period: Mapped[str] = mapped_column(String(8), primary_key=True)
    period_start: Mapped[date] = mapped_column(Date, primary_key=True)
    amount_usd: Mapped[Decimal] = mapped_column(Numeric(20, 10))
    created_at: Mapped[datetime] = now_column()


class BudgetNotice(Base):
    """A budget's soft threshold crossed: once per budget and period (the key), a row that
    waits for an operator's tooling to pick it up (`delivered_at`), like an outbox."""

    __tablename__ = "budget_notices"

    subject: Mapped[str] = mapped_column(String(140), primary_key=True)
    period: Mapped[str] = mapped_column(String(8), primary_key=True)
    period_start: Mapped[date] = mapped_column(Date, primary_key=True)
    tenant_id: Mapped[str] = mapped_column(String(64))
    spent_usd: Mapped[Decimal] = mapped_column(Numeric(20, 10))
    limit_usd: Mapped[Decimal] = mapped_column(Numeric(20, 10))
    created_at: Mapped[datetime] = now_column()
    delivered_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class BudgetApproval(Base):
    """A tenant's monthly budget exhausted: an operator is asked whether its turns may go on
    for the rest of the month (parley/budget_approvals.py). One row per tenant and month, the
    start outbox of its workflow (`workflow_started_at`) and the decision's record; the budget
    check reads it (store/budgets.py)."""

    __tablename__ = "budget_approvals"
    __table_args__ = (
        UniqueConstraint("tenant_id", "period_start", name="uq_budget_approvals_period"),
    )

    id: Mapped[str] = mapped_column(String(120), primary_key=True)  # the workflow's id
    tenant_id: Mapped[str] = mapped_column(String(64))
    period_start: Mapped[date] = mapped_column(Date)  # the month's first day (UTC)
    # waiting -> approved | declined | timed_out
    status: Mapped[str] = mapped_column(String(16))
    timeout_s: Mapped[float] = mapped_column(Float)
    # An approval's new ceiling for the month; None on an approval: no ceiling.
    limit_usd: Mapped[Decimal | None] = mapped_column(Numeric(20, 10))
    decided_by: Mapped[str | None] = mapped_column(String(64))
    decided_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    created_at: Mapped[datetime] = now_column()
    workflow_started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
