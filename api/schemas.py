"""Request and response bodies of the session API (api.md).

Shapes that also travel in events (Message, Action, slots) live in `parley.wire`; the bodies
here embed them. Each response model is built by one constructor from the stored rows.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, field_validator

from parley.config import Settings
from parley.forgetting import Forgotten
from parley.statuses import ExportState
from parley.wire import ActionView, MessageView, SlotView, Timestamp, TurnStateName, View

if TYPE_CHECKING:
    from parley.store.lifecycle.exports import ExportRow
    from parley.store.usage import TenantUsage, Tokens, TurnRun

NO_NUL = "^[^\u0000]*$"
# What `POST .../files` returns as a file id (parley/ids.py `new_id("file")`).
FILE_ID = "^file_[0-9a-f]{20}$"


class PostMessageIn(BaseModel):
    # The pattern documents what `_no_nul` enforces (with a clearer message).
    client_message_id: str = Field(
        min_length=1, max_length=64, json_schema_extra={"pattern": NO_NUL}
    )
    # maxLength is the deployment's `max_message_chars`, added to the OpenAPI document.
    text: str = Field(min_length=1, json_schema_extra={"pattern": NO_NUL})
    # Strict: `false` is not a seq, though Python would read it as 0.
    expected_last_seq: int | None = Field(default=None, strict=True)
    # Files uploaded to this session (`POST .../files`) that the message refers to: ids as
    # the upload returned them, so a malformed one is refused before any lookup.
    file_ids: list[Annotated[str, Field(pattern=FILE_ID)]] = Field(
        default_factory=list, max_length=10
    )
    # A clicked option of the question a specialist is waiting on (an `interaction` event).
    interaction_value: str | None = Field(
        default=None, max_length=100, json_schema_extra={"pattern": NO_NUL}
    )
    mode: Literal["queue", "steer"] = "queue"  # while a turn runs (api.md, steering)

    @field_validator("text", "client_message_id", "interaction_value")
    @classmethod
    def _no_nul(cls, value: str | None) -> str | None:
        # PostgreSQL text cannot hold NUL; say so rather than fail on insert.
        if value is not None and "\x00" in value:
            raise ValueError("must not contain NUL characters")
        return value


class ErrorDetail(BaseModel):
    """`code` is part of the contract; some errors add fields (`field`, `last_seq`,
    `active_turn_id`, `state`, `action`)."""

    model_config = ConfigDict(extra="allow")

    code: str
    message: str


class ErrorOut(BaseModel):
    """Every error answer of the API."""

    error: ErrorDetail


class SessionOut(View):
    id: str
    last_seq: int
    created_at: Timestamp
    # The start of the session's first message; null while it has none (a list may hide it).
    title: str | None = None
    # When its latest message was stored (its creation while it has none).
    last_activity_at: Timestamp | None = None


class SessionList(BaseModel):
    sessions: list[SessionOut]


class ForgottenOut(BaseModel):
    """What forgetting a message removed (docs/features/forgetting.md): rows by kind, the
    events and records scrubbed in place counted with them."""

    message_id: str
    # Every message that went: the one named, and a user message's answer with it.
    message_ids: list[str]
    removed: Forgotten
    # Summary versions that folded it were deleted; the summary workflow is rewriting them.
    summary_rewriting: bool


class TurnOut(BaseModel):
    id: str
    state: TurnStateName
    user_seq: int
    assistant_message_id: str | None
    pending_action: ActionView | None
    created_at: Timestamp
    updated_at: Timestamp
    # The turn's workflow in the Temporal UI, for operators; null unless PARLEY_TEMPORAL_UI_URL.
    workflow_url: str | None = None

    @classmethod
    def from_row(
        cls, turn: Any, pending: Any | None = None, *, settings: Settings | None = None
    ) -> Self:
        """`pending` is the turn's pending action row, if it rests on one; `settings` name
        the Temporal UI that the turn links to."""
        return cls(
            id=turn.id,
            state=turn.state,
            user_seq=turn.user_seq,
            assistant_message_id=turn.assistant_message_id,
            pending_action=ActionView.from_row(pending) if pending is not None else None,
            created_at=turn.created_at,
            updated_at=turn.updated_at,
            workflow_url=settings.turn_workflow_url(turn.id) if settings is not None else None,
        )


class SessionDetail(SessionOut):
    """A session with what a reloaded page needs to resume it."""

    active_turn: TurnOut | None
    pending_action: ActionView | None
    slots: dict[str, SlotView]
    # The message posted while the active turn ran, waiting as the next turn (its `turn_id`
    # is the queued turn's); not in the messages list until that turn starts.
    queued_message: MessageView | None = None

    @classmethod
    def build(
        cls,
        session: Any,
        *,
        active: Any | None,
        pending: Any | None,
        slots: dict[str, Any],
        settings: Settings | None = None,
        queued: MessageView | None = None,
    ) -> Self:
        active_turn = (
            TurnOut.from_row(active, pending, settings=settings) if active is not None else None
        )
        return cls(
            id=session.id,
            last_seq=session.last_seq,
            created_at=session.created_at,
            active_turn=active_turn,
            pending_action=ActionView.from_row(pending) if pending is not None else None,
            slots={name: SlotView.from_row(slot) for name, slot in slots.items()},
            queued_message=queued,
        )


def events_url(session_id: str, turn_id: str) -> str:
    return f"/v1/sessions/{session_id}/turns/{turn_id}/events"


class TurnStarted(BaseModel):
    """A posted (or retried) message's turn, its state (`queued`: behind the running one) and
    stream; null while a person holds the session (`handoff_id`: the case it went to)."""

    turn_id: str | None
    state: TurnStateName | None
    message: MessageView
    events_url: str | None
    steered: bool = False  # joined the running turn `turn_id` (`"mode": "steer"`)
    handoff_id: str | None = None

    @classmethod
    def build(cls, *, session_id: str, turn_id: str, state: str, message: MessageView) -> Self:
        return cls.model_validate(
            {
                "turn_id": turn_id,
                "state": state,
                "message": message,
                "events_url": events_url(session_id, turn_id),
            }
        )


class CancelOut(BaseModel):
    turn: TurnOut


class ActionOut(BaseModel):
    action: ActionView


class TenantOut(View):
    """A tenant's switch and configuration (`store.tenants.TenantRow`)."""

    id: str
    paused: bool
    config: dict[str, Any]


class TokensOut(View):
    requests: int
    input_tokens: int
    output_tokens: int


class UsageOut(View):
    """A tenant's model tokens since `since`: its turns', its summarizer's, and both."""

    since: Timestamp
    turns: TokensOut
    summaries: TokensOut
    total: TokensOut

    @classmethod
    def from_usage(cls, usage: TenantUsage) -> Self:
        def out(part: Tokens) -> TokensOut:
            return TokensOut(
                requests=part.requests,
                input_tokens=part.input_tokens,
                output_tokens=part.output_tokens,
            )

        return cls(
            since=usage.since,
            turns=out(usage.turns),
            summaries=out(usage.summaries),
            total=out(usage.total),
        )


class DemoUser(BaseModel):
    tenant_id: str
    user_id: str
    display_name: str


class WebConfig(BaseModel):
    """What the web page needs before anyone signs in."""

    # One-click sign-in as a seeded demo user (`POST /dev/sign-in/...`); dev only, else empty.
    demo_users: list[DemoUser]
    # A turn's workflow in the Temporal UI, with `{turn_id}` to fill in; null when the server
    # advertises no UI.
    turn_link_template: str | None


class DevSignIn(BaseModel):
    """A fresh bearer token for a seeded demo user."""

    token: str
    user: DemoUser


class Health(BaseModel):
    status: str


class Readiness(BaseModel):
    ready: bool
    checks: dict[str, str]


# --- durable memory (api.md, Memory) --------------------------------------------------------


class MemoryItemOut(View):
    key: str
    value: str
    # "message:<id>" or "action:<id>": the event that wrote it.
    source: str
    created_at: Timestamp
    expires_at: Timestamp


class MemoryOut(BaseModel):
    """The caller's consent and their live remembered items (expired ones never appear)."""

    consent: bool
    items: list[MemoryItemOut]


class ConsentIn(BaseModel):
    # Strict: only a JSON boolean is an answer to "may we remember?".
    consent: bool = Field(strict=True)


# --- files and feedback -------------------------------------------------------------------


class FileOut(View):
    """An uploaded file (`POST .../files`); its bytes are at `GET .../files/{file_id}`."""

    file_id: str = Field(validation_alias="id")
    name: str
    content_type: str
    bytes: int = Field(validation_alias="size")


class FeedbackIn(BaseModel):
    rating: Literal["up", "down"]
    comment: str | None = Field(
        default=None, max_length=2000, json_schema_extra={"pattern": NO_NUL}
    )

    @field_validator("comment")
    @classmethod
    def _no_nul(cls, value: str | None) -> str | None:
        if value is not None and "\x00" in value:
            raise ValueError("must not contain NUL characters")
        return value


class FeedbackOut(View):
    message_id: str
    rating: str
    comment: str | None
    # The run that produced the rated answer: its spans are in the trace ledger.
    turn_id: str | None
    created_at: Timestamp
    updated_at: Timestamp


class TraceSpanOut(View):
    name: str
    attempt: int
    started_at: Timestamp
    ended_at: Timestamp
    outcome: str
    attrs: dict[str, Any] | None


class TurnRunOut(View):
    """One turn of a session as an operator reads it: its model tokens and its trace."""

    turn_id: str
    created_at: Timestamp
    tokens: TokensOut
    trace: list[TraceSpanOut]


class SessionRunsOut(BaseModel):
    """A session's turns, oldest first (`parley eval` reads tokens and traces from here)."""

    session_id: str
    turns: list[TurnRunOut]

    @classmethod
    def build(cls, session_id: str, runs: list[TurnRun]) -> Self:
        return cls(
            session_id=session_id,
            turns=[
                TurnRunOut(
                    turn_id=run.turn_id,
                    created_at=run.created_at,
                    tokens=TokensOut(
                        requests=run.tokens.requests,
                        input_tokens=run.tokens.input_tokens,
                        output_tokens=run.tokens.output_tokens,
                    ),
                    trace=[
                        TraceSpanOut.model_validate(span, from_attributes=True)
                        for span in run.trace
                    ],
                )
                for run in runs
            ],
        )


class RatedAnswerOut(FeedbackOut):
    """A rating as an operator reads it: who, the answer's text, and the run's trace."""

    user_id: str
    session_id: str
    answer_text: str
    trace: list[TraceSpanOut]


class FeedbackList(BaseModel):
    feedback: list[RatedAnswerOut]


class ExportOut(BaseModel):
    """An export of the caller's data: how far it got, and where its archive is."""

    id: str
    state: ExportState
    # Progress: the caller's sessions written into the archive so far, of all of them.
    sessions_total: int
    sessions_done: int
    # What the archive holds by kind (sessions, messages, files, memory_items, pinned_facts,
    # feedback, actions), once it is ready.
    counts: dict[str, int]
    bytes: int | None
    created_at: Timestamp
    # Both links answer 410 `export_expired` from this moment.
    expires_at: Timestamp
    finished_at: Timestamp | None
    status_url: str
    archive_url: str

    @classmethod
    def build(cls, row: ExportRow) -> Self:
        status_url = f"/v1/me/exports/{row.id}"
        return cls(
            id=row.id,
            state=ExportState(row.state),
            sessions_total=row.sessions_total,
            sessions_done=row.sessions_done,
            counts=row.counts,
            bytes=row.size,
            created_at=row.created_at,
            expires_at=row.expires_at,
            finished_at=row.finished_at,
            status_url=status_url,
            archive_url=f"{status_url}/archive",
        )


class ErasureStarted(BaseModel):
    """The answer to `DELETE /v1/me`: the erasure and where to follow it (no token needed:
    the caller's tokens stop working at once)."""

    erasure_id: str
    status: str
    status_url: str


class ErasureOut(BaseModel):
    """An erasure's progress and, once `done`, its receipt: rows deleted per table and the
    times. It names nobody: no user id, no text."""

    erasure_id: str
    scope: Literal["user", "session"]
    status: Literal["requested", "running", "done"]
    requested_at: Timestamp
    started_at: Timestamp | None
    finished_at: Timestamp | None
    counts: dict[str, int]
    total: int

    @classmethod
    def from_row(cls, row: Any) -> Self:
        return cls(
            erasure_id=row.id,
            scope=row.scope,
            status=row.status,
            requested_at=row.requested_at,
            started_at=row.started_at,
            finished_at=row.finished_at,
            counts=dict(sorted(row.counts.items())),
            total=sum(row.counts.values()),
        )
