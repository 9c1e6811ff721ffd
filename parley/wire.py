"""The shapes that cross the wire: shared views and every event payload of a turn's stream.

These are the contract's types (api.md), defined once. The API's routes embed them in their
response bodies (`api/schemas.py`), the event stream checks what it sends against them, and the
tests read them. This module imports pydantic only, so the event writer, the workflows' side and
test readers can use it without FastAPI or SQLAlchemy; views are built from any object with the
right attributes (an ORM row, a dataclass), never from a store import.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import date, datetime
from typing import Annotated, Any, Literal, Self, Union

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    GetJsonSchemaHandler,
    PlainSerializer,
    RootModel,
    SerializerFunctionWrapHandler,
    WithJsonSchema,
    create_model,
    model_serializer,
)
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import core_schema

from parley.contracts import WarningCode
from parley.tools import TOOLS


def _iso(moment: datetime) -> str:
    # `isoformat()` is what the API has always sent (`+00:00`, not pydantic's `Z`).
    return moment.isoformat()


Timestamp = Annotated[
    datetime,
    PlainSerializer(_iso, return_type=str),
    WithJsonSchema({"type": "string", "format": "date-time"}),
]


def _calendar_day(value: object) -> object:
    # A day is written `YYYY-MM-DD` (JSON Schema's `date`); pydantic alone would also take
    # `0` or `1700000000` as a Unix time.
    if not isinstance(value, date) and not (
        isinstance(value, str) and len(value) == 10 and value[4] == value[7] == "-"
    ):
        raise ValueError("a day is written YYYY-MM-DD")
    return value


# A calendar day, as JSON Schema's `date` format spells it and nothing else.
CalendarDay = Annotated[date, BeforeValidator(_calendar_day)]


def _integral(value: object) -> object:
    # JSON Schema's integer is any number without a fraction, so `5.0` is one; Python reads
    # it as a float, which a strict int refuses.
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


# An optional integer of a strict model (parley/tenancy.py): `5` and `5.0`, never `true` or
# `"5"`. The validator wraps the union, so a field's bounds stay `minimum`/`maximum` in the
# OpenAPI document.
IntOrNone = Annotated[int | None, BeforeValidator(_integral)]
# The same, required.
Integral = Annotated[int, BeforeValidator(_integral)]

# Values the contract names; stored rows only ever hold these.
Role = Literal["user", "assistant", "tool"]
MessageStatusName = Literal["complete", "incomplete", "cancelled", "retracted"]
TurnStateName = Literal[
    "queued",
    "received",
    "building_context",
    "calling_model",
    "executing_tools",
    "awaiting_confirmation",
    "awaiting_input",
    "executing_action",
    "completed",
    "failed",
    "cancelled",
    "expired",
]
# Beyond the contract's five, an executed send can end `failed` or `unknown` (the email service
# did not say); clients treat both as not executed.
ActionStatusName = Literal[
    "pending", "confirmed", "declined", "expired", "superseded", "executed", "failed", "unknown"
]


class View(BaseModel):
    """A response shape read off a stored row's attributes."""

    model_config = ConfigDict(from_attributes=True)

    @classmethod
    def from_row(cls, row: object) -> Self:
        return cls.model_validate(row, from_attributes=True)


class ArtifactData(BaseModel):
    """A file a skill produced, stored with the session (`GET .../files/{file_id}`)."""

    file_id: str
    name: str
    content_type: str
    bytes: int


class ToolView(BaseModel):
    """What a user may see of a tool's run: never its raw result (backend payloads, carrier
    notes, error strings or allow-list hints stay in the store, for the model only). `files`:
    what a skill's run stored with the session (its `artifact` events), only when there are
    any, so a page drawn again from the messages shows them again."""

    name: str
    label: str
    status: Literal["ok", "error", "refused"]
    files: list[ArtifactData] | None = None

    # No return annotation: pydantic would take it as this model's output schema.
    @model_serializer(mode="wrap")
    def _omit_no_files(self, handler: SerializerFunctionWrapHandler):  # type: ignore[no-untyped-def]
        data: dict[str, Any] = handler(self)
        if data.get("files") is None:
            data.pop("files", None)
        return data


class ToolCallView(BaseModel):
    """A tool call the model asked for: its id, the tool and the arguments it gave."""

    id: str
    name: str
    arguments: Any


class VersionsView(BaseModel):
    """A message with more than one version (an edited user message, a regenerated answer):
    how many there are and which one is shown (1 is the first written)."""

    count: int
    shown: int


class ElsewhereView(View):
    """An action that ran on another version of the conversation: it stays done on every
    version (store/branches.py)."""

    action_id: str
    tool: str
    summary: str
    recipient_masked: str | None
    status: str
    resolved_at: Timestamp | None


class MessageView(View):
    """The contract's `Message`; `tool_calls`, `tool_call_id`, `tool` and `versions` appear
    only when set (`versions` only in `GET .../messages`, on a message with several).

    An allow-list: fields are named here one by one, and a `tool` message shows its tool's
    label as its text, with `tool` = name, label and status."""

    id: str
    seq: int
    role: Role
    turn_id: str | None
    status: MessageStatusName
    text: str
    tool_calls: list[ToolCallView] | None = None
    tool_call_id: str | None = None
    tool: ToolView | None = None
    created_at: Timestamp
    versions: VersionsView | None = None
    # A reply written by a person of the support team (an `assistant` message): the name the
    # customer sees beside it. Only when set.
    author_name: str | None = None

    @classmethod
    def from_row(cls, row: object) -> Self:
        view = cls.model_validate(row, from_attributes=True)
        if view.role != "tool":
            return view
        shown = tool_view(view.text)
        return view.model_copy(update={"text": shown.label, "tool": shown})

    # No return annotation: pydantic would take it as this model's output schema.
    @model_serializer(mode="wrap")
    def _omit_unset_tool_fields(self, handler: SerializerFunctionWrapHandler):  # type: ignore[no-untyped-def]
        data: dict[str, Any] = handler(self)
        for optional in ("tool_calls", "tool_call_id", "tool", "versions", "author_name"):
            if data.get(optional) is None:
                data.pop(optional, None)
        return data


def tool_view(stored: str) -> ToolView:
    """A stored tool message (`{"name", "result"}` JSON) as the user may see it."""
    try:
        record = json.loads(stored)
        name, result = str(record["name"]), record.get("result") or {}
    except (ValueError, KeyError, TypeError):
        return ToolView(name="unknown", label="Working on it…", status="error")
    spec = TOOLS.get(name)
    error = result.get("error") if isinstance(result, dict) else None
    status: Literal["ok", "error", "refused"] = "ok"
    if error is not None:
        refused = isinstance(error, dict) and error.get("code") == "refused"
        status = "refused" if refused else "error"
    label = spec.label if spec else "Working on it…"
    return ToolView(name=name, label=label, status=status, files=_files(result))


def _files(result: object) -> list[ArtifactData] | None:
    """The files a stored tool result names (a skill's `artifacts`); None when there are none."""
    listed = result.get("artifacts") if isinstance(result, dict) else None
    if not isinstance(listed, list) or not listed:
        return None
    try:
        return [ArtifactData.model_validate(a) for a in listed]
    except ValueError:
        return None


class AttachmentView(View):
    """A file an action sends: its name and, for an export, how many rows it holds."""

    name: str
    rows: int | None = None


def card_attachment(args: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The file a proposal's arguments carry, as its card names it (`{name, rows}`)."""
    attached = (args or {}).get("attachment")
    if not attached:
        return None
    return {"name": attached["filename"], "rows": attached.get("rows")}


class ActionView(View):
    """The contract's `Action`, rendered from the stored proposal, never from model text."""

    id: str
    # The turn whose stream shows the card (and, for a renewal, its send).
    turn_id: str
    tool: str
    summary: str
    recipient_masked: str | None
    args_hash: str
    status: ActionStatusName
    # When the card lapses unanswered (then `expired`; `POST .../renew` asks again).
    expires_at: Timestamp
    # The expired card this one renews: the same tool and arguments, a new window.
    renewed_from: str | None = None
    # The file the email carries, when it carries one (the card shows its name and rows).
    attachment: AttachmentView | None = None


class SlotView(View):
    """One conversation slot with where its value came from."""

    value: Any
    source: str
    set_at_seq: int


class Option(BaseModel):
    label: str
    value: str


# --- event payloads (the `data:` of each event type) ------------------------------------------


class StateData(BaseModel):
    state: TurnStateName


class DeltaData(BaseModel):
    """Text to append to the message being streamed."""

    message_id: str
    text: str


class ResetData(BaseModel):
    """Drop what was appended for this message; a retry of the model call follows."""

    message_id: str
    reason: str


class ToolData(BaseModel):
    call_id: str
    name: str
    phase: Literal["start", "end"]
    status: str | None = Field(default=None, description="only on `end`: ok, error, refused…")
    label: str

    # No return annotation: pydantic would take it as this model's output schema.
    @model_serializer(mode="wrap")
    def _omit_status_on_start(self, handler: SerializerFunctionWrapHandler):  # type: ignore[no-untyped-def]
        data: dict[str, Any] = handler(self)
        if data.get("status") is None:
            data.pop("status", None)
        return data


class ActionData(BaseModel):
    """`confirmation_required`, `confirmation_expiring` and `confirmation_resolved`."""

    action: ActionView


class ClarificationData(BaseModel):
    question: str
    options: list[Option]


class SubagentData(BaseModel):
    """A specialist took over (`start`) or handed back (`end`)."""

    name: str
    phase: Literal["start", "end"]


class InteractionData(BaseModel):
    """A specialist waits for the user: a question with options. The user's next message
    (or `interaction_value`) answers `interaction_id`."""

    agent: str
    question: str
    options: list[Option]
    interaction_id: str


class WarningData(BaseModel):
    """Degraded, not failed."""

    code: WarningCode
    message: str


class RetractedData(BaseModel):
    """The output screen declined an answer after it streamed."""

    message_id: str
    replacement_text: str


class SteeredData(BaseModel):
    """The turn took a message the user sent while it ran (`"mode": "steer"`): the model is
    called again with it. `superseded_message_id`: the answer that was streaming when it
    came, stopped and kept only as superseded (never the turn's answer); null when the steer
    was taken after a batch of tool calls."""

    message_id: str
    superseded_message_id: str | None = None


class FollowupsData(BaseModel):
    suggestions: list[str]


class CitationSource(BaseModel):
    doc: str
    section: str
    version: int


class CitationsData(BaseModel):
    """The knowledge passages an answer used (sent before `done`)."""

    message_id: str
    sources: list[CitationSource]


class MessageData(BaseModel):
    """`done` and `cancelled`: the turn's final assistant message."""

    message: MessageView


class ErrorData(BaseModel):
    code: str
    message: str
    retryable: bool


EVENT_DATA: dict[str, type[BaseModel]] = {
    "state": StateData,
    "delta": DeltaData,
    "reset": ResetData,
    "tool": ToolData,
    "confirmation_required": ActionData,
    "confirmation_resolved": ActionData,
    "confirmation_expiring": ActionData,
    "clarification": ClarificationData,
    "warning": WarningData,
    "retracted": RetractedData,
    "followups": FollowupsData,
    "citations": CitationsData,
    "subagent": SubagentData,
    "interaction": InteractionData,
    "done": MessageData,
    "error": ErrorData,
    "cancelled": MessageData,
    "artifact": ArtifactData,
    "steered": SteeredData,
}


def event_data(event: str, data: dict[str, Any]) -> BaseModel:
    """The typed payload of one stored event; raises `ValidationError` if it breaks the shape,
    `KeyError` for a type the contract does not know."""
    return EVENT_DATA[event].model_validate(data)


class JsonText:
    """Marks a `str` field as JSON text of `model`: how an SSE frame carries its `data:`."""

    def __init__(self, model: type[BaseModel]) -> None:
        self.model = model

    def __get_pydantic_json_schema__(
        self, _: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        return {
            "type": "string",
            "contentMediaType": "application/json",
            "contentSchema": handler(self.model.__pydantic_core_schema__),
        }


def _frame(event: str, data: type[BaseModel]) -> type[BaseModel]:
    """One SSE frame of this type as a client's parser sees it: three text fields."""
    name = "".join(part.title() for part in event.split("_")) + "Event"
    kind: Any = Literal[event]  # a literal built at run time, once per event type
    return create_model(
        name,
        id=(str, Field(pattern="^[0-9]+$", description="monotonic within the turn, from 1")),
        event=(kind, ...),
        data=(Annotated[str, JsonText(data)], ...),
    )


class RetryFrame(BaseModel):
    """The stream's first frame: how long a browser waits before reconnecting."""

    retry: int


# Built from EVENT_DATA, so adding an event type there documents it in OpenAPI too.
_FRAMES: Any = Union[  # noqa: UP007
    (RetryFrame, *(_frame(event, data) for event, data in EVENT_DATA.items()))
]


class TurnStreamEvent(RootModel[Any]):
    """One frame of `text/event-stream`; the stream closes after `done`, `error` or
    `cancelled` (or rests after `confirmation_required`)."""

    root: _FRAMES
