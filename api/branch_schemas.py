"""The conversation as a branch's path shows it (`GET .../messages`), and the bodies and
answers of the versions routes (api/routes/branches.py): an edit's new text, and the version
a switch shows."""

from __future__ import annotations

from pydantic import BaseModel, Field, field_validator

from parley.api.schemas import NO_NUL
from parley.live import CURSOR_PATTERN
from parley.wire import ElsewhereView, MessageView, VersionsView


class MessageList(BaseModel):
    """The active path's messages; `elsewhere`: actions done on other versions of it;
    `cursor`: where the session stream takes up from this read."""

    messages: list[MessageView]
    elsewhere: list[ElsewhereView] = Field(default_factory=list)
    cursor: str = Field(
        pattern=CURSOR_PATTERN,
        description="the session stream's cursor as of this read (the same snapshot as its "
        "messages): sent as the stream's first `Last-Event-ID`, it replays what came after",
    )


class EditMessageIn(BaseModel):
    """A new version of a user message: its text, under a key of the client's own (a repeat
    with the same key and text answers the first edit's turn)."""

    client_message_id: str = Field(
        min_length=1, max_length=64, json_schema_extra={"pattern": NO_NUL}
    )
    text: str = Field(min_length=1, json_schema_extra={"pattern": NO_NUL})

    @field_validator("text", "client_message_id")
    @classmethod
    def _no_nul(cls, value: str) -> str:
        if "\x00" in value:
            raise ValueError("must not contain NUL characters")
        return value


class VersionSwitched(BaseModel):
    """The version now shown of the message switched at (its id is the one given)."""

    message_id: str
    versions: VersionsView
