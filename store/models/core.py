"""The core record: tenants, users and tokens, sessions and messages, turns and their events,
model and tool calls, actions, slots, trace spans and result sets."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    Boolean,
    Computed,
    DateTime,
    ForeignKey,
    ForeignKeyConstraint,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    func,
)
from sqlalchemy import event as orm_event
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, TSVECTOR
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from parley.contracts import MessageStatus
from parley.statuses import ToolCallStatus
from parley.tokens import count_message, default_counter
from parley.wire import card_attachment


class Base(DeclarativeBase):
    pass


def now_column() -> Mapped[datetime]:
    return mapped_column(DateTime(timezone=True), server_default=func.now(), nullable=False)


class Tenant(Base):
    __tablename__ = "tenants"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    paused: Mapped[bool] = mapped_column(Boolean, default=False, server_default="false")
    # Per-tenant settings over the code defaults (parley/tenancy.py); never credentials.
    config: Mapped[dict[str, Any]] = mapped_column(JSONB, default=dict, server_default="{}")
    # Signs the tenant's hand-off webhook deliveries (parley/webhooks.py): made at first use.
    webhook_secret: Mapped[str | None] = mapped_column(String(64))
    created_at: Mapped[datetime] = now_column()


class User(Base):
    __tablename__ = "users"

    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"), primary_key=True)
    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    display_name: Mapped[str] = mapped_column(String(200))
    email: Mapped[str | None] = mapped_column(String(320))
    roles: Mapped[list[str]] = mapped_column(ARRAY(String(32)), server_default="{}")
    # What the user may use (parley/features.py); everyone has the assistant until revoked.
    features: Mapped[list[str]] = mapped_column(ARRAY(String(32)), server_default="{assistant}")
    # The identity provider that made the user on first sight (parley/oidc.py); NULL for a
    # user Parley made (seeded, the CLI). A provider's token reaches only its own users.
    issuer: Mapped[str | None] = mapped_column(String(300))
    created_at: Mapped[datetime] = now_column()


class ApiToken(Base):
    """Bearer tokens are stored as SHA-256 digests; the plain token is shown once."""

    __tablename__ = "api_tokens"
    __table_args__ = (
        ForeignKeyConstraint(["tenant_id", "user_id"], ["users.tenant_id", "users.id"]),
    )

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(String(64))
    user_id: Mapped[str] = mapped_column(String(64))
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = now_column()
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # A token past this moment is refused like a revoked one; NULL never expires.
    expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class ChatSession(Base):
    __tablename__ = "sessions"
    __table_args__ = (
        ForeignKeyConstraint(["tenant_id", "user_id"], ["users.tenant_id", "users.id"]),
        Index("ix_sessions_owner", "tenant_id", "user_id", "created_at"),
    )

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(String(64))
    user_id: Mapped[str] = mapped_column(String(64))
    # Highest seq stored in this session; the session row is the lock that orders messages.
    last_seq: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # The turn that holds the session; at most one at a time.
    active_turn_id: Mapped[str | None] = mapped_column(String(40))
    # The turn queued behind the active one (store/queue.py), at most one; on this row so that
    # the statement releasing the session reads it under the session's lock.
    queued_turn_id: Mapped[str | None] = mapped_column(String(40))
    # The active branch (store/models/branches.py): new messages and turns join it.
    branch: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # The seq of the newest message that steered the session's running turn (store/steering.py):
    # the doorbell a streaming model call and the turn's ending read, on this row so that the
    # statement releasing the session reads it under the session's lock.
    steer_seq: Mapped[int | None] = mapped_column(Integer)
    # The last of the session's own events (store/live.py), counted under this row's lock,
    # which every writer of one holds already.
    last_event_id: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # Set when the owner deletes the session: from then on it is missing to every route (404),
    # while its turns, actions and traces stay for the operators' record.
    deleted_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    created_at: Mapped[datetime] = now_column()
    updated_at: Mapped[datetime] = now_column()


class Message(Base):
    __tablename__ = "messages"
    __table_args__ = (
        UniqueConstraint("session_id", "seq", name="uq_messages_session_seq"),
        UniqueConstraint("session_id", "client_message_id", name="uq_messages_client_id"),
        # Recall searches every stored message of a session by full text.
        Index("ix_messages_tsv", "tsv", postgresql_using="gin"),
    )

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    session_id: Mapped[str] = mapped_column(ForeignKey("sessions.id"))
    seq: Mapped[int] = mapped_column(Integer)
    role: Mapped[str] = mapped_column(String(16))
    turn_id: Mapped[str | None] = mapped_column(String(40))
    status: Mapped[str] = mapped_column(String(16), default=MessageStatus.complete)
    text: Mapped[str] = mapped_column(Text, default="")
    client_message_id: Mapped[str | None] = mapped_column(String(64))
    tool_calls: Mapped[list[dict[str, Any]] | None] = mapped_column(JSONB)
    tool_call_id: Mapped[str | None] = mapped_column(String(64))
    # Files the user attached to this message (`files.id`, checked as theirs when posted).
    file_ids: Mapped[list[str] | None] = mapped_column(JSONB)
    # An incomplete or cancelled answer that a retry replaced; hidden from lists and prompts.
    replaced_by: Mapped[str | None] = mapped_column(String(40))
    # The branch it was written on, and whether the session's active path leaves it out
    # (store/branches.py keeps this; every read of the conversation filters on it).
    branch: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    off_path: Mapped[bool] = mapped_column(Boolean, default=False, server_default="false")
    # A person's reply in a handed-off conversation (role `assistant`): the agent's display
    # name, shown beside it (store/handoffs.py); NULL for the assistant's own words.
    author_name: Mapped[str | None] = mapped_column(String(200))
    # Counted when the message is written (see `_count_tokens`), by the counter named beside
    # it; a prompt packed with another counter recounts. NULL on rows older than the column.
    token_count: Mapped[int | None] = mapped_column(Integer)
    token_counter: Mapped[str | None] = mapped_column(String(32))
    # Full-text index of the text, kept by PostgreSQL itself.
    tsv: Mapped[Any] = mapped_column(
        TSVECTOR, Computed("to_tsvector('english', coalesce(text, ''))", persisted=True)
    )
    created_at: Mapped[datetime] = now_column()


@orm_event.listens_for(Message, "before_insert")
@orm_event.listens_for(Message, "before_update")
def _count_tokens(_mapper: Any, _connection: Any, message: Message) -> None:
    """Every stored message carries its token count, whoever writes it."""
    count_tokens(message)


def count_tokens(message: Message) -> None:
    """Set the message's token count and counter (for writers that bypass the ORM flush)."""
    counter = default_counter()
    message.token_count = count_message(
        counter,
        {"role": message.role, "content": message.text or "", "tool_calls": message.tool_calls},
    )
    message.token_counter = counter.name


class Turn(Base):
    __tablename__ = "turns"
    __table_args__ = (
        Index("ix_turns_session", "session_id", "created_at"),
        # The outbox sweep looks only at turns whose workflow start is not yet confirmed.
        Index(
            "ix_turns_unstarted",
            "created_at",
            postgresql_where="workflow_started_at IS NULL",
        ),
        # The per-user active-turn limit counts a user's unfinished turns.
        Index(
            "ix_turns_user_unfinished",
            "tenant_id",
            "user_id",
            postgresql_where="state NOT IN ('completed', 'failed', 'cancelled', 'expired')",
        ),
        # The sweep for turns whose workflow closed while the row says they have not ended.
        Index(
            "ix_turns_open",
            "updated_at",
            postgresql_where=(
                "state NOT IN ('completed', 'failed', 'cancelled', 'expired')"
                " AND workflow_started_at IS NOT NULL"
            ),
        ),
    )

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    session_id: Mapped[str] = mapped_column(ForeignKey("sessions.id"))
    tenant_id: Mapped[str] = mapped_column(String(64))
    user_id: Mapped[str] = mapped_column(String(64))
    user_message_id: Mapped[str] = mapped_column(String(40))
    user_seq: Mapped[int] = mapped_column(Integer)
    state: Mapped[str] = mapped_column(String(32))
    assistant_message_id: Mapped[str | None] = mapped_column(String(40))
    # Counter behind the per-turn monotonic event ids; the row lock serialises appends.
    last_event_id: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    workflow_started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # The user's Stop, recorded once under the row lock: from then on every step refuses to
    # run and every ending is `cancelled` (a 202 to the cancel always means that).
    cancel_requested_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    error: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    # What the reference resolver decided for this turn's message (kind, order, assumption).
    resolution: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    # The turn this one retries (same user message; its answer replaces the failed one).
    retry_of: Mapped[str | None] = mapped_column(String(40))
    # The branch the turn was born on (the session's active one then).
    branch: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # Open event streams across all API processes, and when the last one closed: a turn
    # nobody watches is cancelled after a grace period.
    viewers: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    detached_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    created_at: Mapped[datetime] = now_column()
    updated_at: Mapped[datetime] = now_column()


class UsageCounter(Base):
    """How much of a limit a user or tenant has used in one window (a minute, a UTC day).

    One row per (scope, subject, window), incremented by a conditional upsert, so concurrent
    posts in every API process count atomically (store/limits.py).
    """

    __tablename__ = "usage_counters"

    scope: Mapped[str] = mapped_column(String(32), primary_key=True)
    subject: Mapped[str] = mapped_column(String(200), primary_key=True)
    window_start: Mapped[datetime] = mapped_column(DateTime(timezone=True), primary_key=True)
    used: Mapped[int] = mapped_column(Integer, default=0, server_default="0")


class StreamLease(Base):
    """One open event stream, held by whichever API process serves it: the per-user stream
    limit counts these across processes. A process that dies stops renewing its leases, so
    they lapse at `expires_at` instead of holding the user's slots forever."""

    __tablename__ = "stream_leases"
    __table_args__ = (Index("ix_stream_leases_owner", "tenant_id", "user_id"),)

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(String(64))
    user_id: Mapped[str] = mapped_column(String(64))
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    # A session stream's session (api/live.py): while one is open, the session's running turn
    # has someone watching it (store/viewers.py `abandoned`). None for a turn's stream.
    session_id: Mapped[str | None] = mapped_column(String(40))


class TurnEvent(Base):
    """The durable event log behind every stream; SSE replays it by id."""

    __tablename__ = "turn_events"

    turn_id: Mapped[str] = mapped_column(ForeignKey("turns.id"), primary_key=True)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    type: Mapped[str] = mapped_column(String(32))
    data: Mapped[dict[str, Any]] = mapped_column(JSONB)
    created_at: Mapped[datetime] = now_column()


class ModelCall(Base):
    """One model call of a turn: the prompt the context builder packed and what came back.

    This is how the workflow passes ids instead of prompts: `build_context` writes the
    request here and the call-model activity reads it back by id.
    """

    __tablename__ = "model_calls"
    __table_args__ = (UniqueConstraint("turn_id", "step", name="uq_model_calls_turn_step"),)

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    turn_id: Mapped[str] = mapped_column(ForeignKey("turns.id"), index=True)
    # 0 for the turn's first model call, then one more after each round of tool results.
    step: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    provider: Mapped[str] = mapped_column(String(32))
    model: Mapped[str] = mapped_column(String(100))
    request: Mapped[dict[str, Any]] = mapped_column(JSONB)
    response_text: Mapped[str | None] = mapped_column(Text)
    # Tool calls the model asked for: [{"id", "name", "arguments"}], arguments as sent.
    response_tool_calls: Mapped[list[dict[str, Any]] | None] = mapped_column(JSONB)
    finish_reason: Mapped[str | None] = mapped_column(String(32))
    attempts: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    first_token_ms: Mapped[float | None]
    total_ms: Mapped[float | None]
    usage: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    created_at: Mapped[datetime] = now_column()
    completed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class ToolCall(Base):
    """One tool call the model asked for, and what server code made of it."""

    __tablename__ = "tool_calls"

    id: Mapped[str] = mapped_column(String(80), primary_key=True)
    turn_id: Mapped[str] = mapped_column(ForeignKey("turns.id"), index=True)
    model_call_id: Mapped[str] = mapped_column(ForeignKey("model_calls.id"))
    # The id the provider gave the call; unique only within its model call.
    provider_call_id: Mapped[str] = mapped_column(String(80))
    name: Mapped[str] = mapped_column(String(64))
    arguments: Mapped[Any] = mapped_column(JSONB)
    args_hash: Mapped[str] = mapped_column(String(64))
    status: Mapped[str] = mapped_column(String(16), default=ToolCallStatus.pending)
    result: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    attempts: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    created_at: Mapped[datetime] = now_column()
    completed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class Action(Base):
    """A pending side effect, proposed by a tool and executed only after the user confirms.

    Everything the user is asked to confirm is rendered from this row, never from model
    text; `args_hash` binds the confirmation to exactly these arguments.
    """

    __tablename__ = "actions"
    __table_args__ = (
        Index("ix_actions_session", "session_id", "status"),
        # The decisions' outbox sweep looks only at decisions not yet delivered.
        Index(
            "ix_actions_undelivered",
            "resolved_at",
            postgresql_where=(
                "decision_delivered_at IS NULL"
                " AND status IN ('confirmed', 'declined', 'superseded')"
            ),
        ),
        UniqueConstraint("renewed_from", name="uq_actions_renewed_from"),
        # The expiry warning's sweep looks only at pending cards not yet warned about.
        Index(
            "ix_actions_unwarned",
            "expires_at",
            postgresql_where="status = 'pending' AND warned_at IS NULL",
        ),
        # The renewals' start outbox: renewed cards whose workflow has not been started.
        Index(
            "ix_actions_renewal_unstarted",
            "created_at",
            postgresql_where="renewed_from IS NOT NULL AND renewal_started_at IS NULL",
        ),
    )

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    session_id: Mapped[str] = mapped_column(ForeignKey("sessions.id"))
    turn_id: Mapped[str] = mapped_column(ForeignKey("turns.id"))
    tenant_id: Mapped[str] = mapped_column(String(64))
    user_id: Mapped[str] = mapped_column(String(64))
    tool: Mapped[str] = mapped_column(String(64))
    args: Mapped[dict[str, Any]] = mapped_column(JSONB)
    args_hash: Mapped[str] = mapped_column(String(64))
    summary: Mapped[str] = mapped_column(Text)
    recipient_masked: Mapped[str | None] = mapped_column(String(320))
    status: Mapped[str] = mapped_column(String(16))
    decline_reason: Mapped[str | None] = mapped_column(String(32))
    outcome: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    created_at: Mapped[datetime] = now_column()
    resolved_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # When the user's decision reached the waiting turn (or there was no turn left to take
    # it). The API delivers it after commit; the worker's sweep delivers one the API could
    # not (Temporal away): dispatch/control.py.
    decision_delivered_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # When `confirmation_expiring` was shown for this card (once; dispatch/approvals.py).
    warned_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # The expired card this one renews (`POST .../renew`): the same tool and arguments, a new
    # window; an expired card is renewed at most once.
    renewed_from: Mapped[str | None] = mapped_column(String(40))
    # When the renewal's workflow was started (workflows/renewal.py): the row is its start
    # outbox, as a turn's row is the turn's (dispatch/approvals.py sweeps the ones missed).
    renewal_started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))

    @property
    def attachment(self) -> dict[str, Any] | None:
        """The file the card names (`{name, rows}`), when the proposal carries one."""
        return card_attachment(self.args)


class SpecialistAnswer(Base):
    """The user's answer to a specialist's question: the delivery outbox. Committed with the
    user's message; the API signals the waiting specialist at once and marks it delivered,
    and the worker's sweep delivers any the API did not (dispatch/specialists.py)."""

    __tablename__ = "specialist_answers"
    __table_args__ = (
        # The sweep looks only at answers not yet delivered.
        Index(
            "ix_specialist_answers_undelivered",
            "created_at",
            postgresql_where="delivered_at IS NULL",
        ),
    )

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    turn_id: Mapped[str] = mapped_column(ForeignKey("turns.id"))
    interaction_id: Mapped[str] = mapped_column(String(100))
    # The chosen option's value, or "" when the user's words matched no option.
    value: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = now_column()
    delivered_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class SessionSlot(Base):
    """Structured conversation state with provenance: what the conversation is about."""

    __tablename__ = "slots"

    session_id: Mapped[str] = mapped_column(ForeignKey("sessions.id"), primary_key=True)
    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[Any] = mapped_column(JSONB)
    source: Mapped[str] = mapped_column(String(64))
    set_at_seq: Mapped[int] = mapped_column(Integer)
    updated_at: Mapped[datetime] = now_column()


class TraceSpan(Base):
    """The trace ledger: one row per step of a turn (activity), with its timing.

    Operators read it to see where a turn spent its time; tests read it to check that steps
    that should overlap (input screen and context building) did.
    """

    __tablename__ = "trace_spans"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    turn_id: Mapped[str] = mapped_column(ForeignKey("turns.id"), index=True)
    name: Mapped[str] = mapped_column(String(64))
    attempt: Mapped[int] = mapped_column(Integer, default=1)
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    ended_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    outcome: Mapped[str] = mapped_column(String(32))
    attrs: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    # The OpenTelemetry trace the step was part of (32 hex digits), when tracing is on.
    otel_trace_id: Mapped[str | None] = mapped_column(String(32), nullable=True)


class ResultSet(Base):
    """A search's result kept as a referent: the query, the ordered order ids and the rows it
    found, and the turn it came from, so "those" and "just the ones over $500" mean it."""

    __tablename__ = "result_sets"
    __table_args__ = (Index("ix_result_sets_session", "session_id", "user_seq"),)

    # Derived from the tool call (parley/ids.py), so a retried attempt stores one row.
    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    session_id: Mapped[str] = mapped_column(ForeignKey("sessions.id"))
    turn_id: Mapped[str] = mapped_column(ForeignKey("turns.id"))
    tool_call_id: Mapped[str] = mapped_column(String(80))
    user_seq: Mapped[int] = mapped_column(Integer)
    query: Mapped[dict[str, Any]] = mapped_column(JSONB)
    order_ids: Mapped[list[str]] = mapped_column(JSONB)
    rows: Mapped[list[dict[str, Any]]] = mapped_column(JSONB)
    # Whether its turn is off the session's active path (store/branches.py).
    off_path: Mapped[bool] = mapped_column(Boolean, default=False, server_default="false")
    created_at: Mapped[datetime] = now_column()
