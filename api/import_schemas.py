"""The bodies and answers of importing earlier conversation (api/routes/imports.py,
`POST .../import`): the items as the contract takes them, and an import as it answers."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, Self

from pydantic import AwareDatetime, BaseModel, Field, field_validator

from parley.api.schemas import NO_NUL
from parley.statuses import ImportState
from parley.wire import Timestamp

if TYPE_CHECKING:
    from parley.store.imports import ImportRow


class ImportItemIn(BaseModel):
    """One earlier message, said at `created_at` (with a timezone; stored as its time). The
    rules beyond types (parley/imports.py `check_items`) name the item's index too."""

    role: Literal["user", "assistant"]
    text: str = Field(min_length=1, json_schema_extra={"pattern": NO_NUL})  # max_message_chars
    created_at: AwareDatetime

    @field_validator("created_at", mode="before")
    @classmethod
    def _written_as_text(cls, value: Any) -> Any:
        """The contract's date-time is text. Pydantic would read a number as seconds since
        1970 and accept what the schema refuses."""
        if isinstance(value, int | float):
            raise ValueError("a date-time is text with its offset, e.g. 2026-01-31T09:00:00Z")
        return value


class ImportIn(BaseModel):
    # Idempotency key: again with the same items, the first import; with others, a 422.
    client_import_id: str = Field(min_length=1, max_length=64, pattern=NO_NUL)
    items: list[ImportItemIn] = Field(min_length=1)  # at most `max_import_messages`


class ImportOut(BaseModel):
    """An import: its messages' seqs, and how many recall by meaning finds so far (`indexed`;
    full-text search finds all from the start)."""

    id: str
    session_id: str
    client_import_id: str
    status: ImportState
    messages: int
    indexed: int
    first_seq: int
    last_seq: int
    created_at: Timestamp
    finished_at: Timestamp | None
    status_url: str

    @classmethod
    def build(cls, row: ImportRow) -> Self:
        fields = {k: getattr(row, k) for k in cls.model_fields if hasattr(row, k)}
        status_url = f"/v1/sessions/{row.session_id}/imports/{row.id}"
        return cls.model_validate(fields | {"status_url": status_url})
