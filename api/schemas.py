"""Request and response bodies of the session API (api.md)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field, field_validator

from store.actions import action_view
from store.models import Action, ChatSession, Message, Turn
from store.sessions import message_payload


class PostMessageIn(BaseModel):
    client_message_id: str = Field(min_length=1, max_length=64)
    text: str = Field(min_length=1)
    expected_last_seq: int | None = None

    @field_validator("text", "client_message_id")
    @classmethod
    def _no_nul(cls, value: str) -> str:
        # PostgreSQL text cannot hold NUL; say so rather than fail on insert.
        if "\x00" in value:
            raise ValueError("must not contain NUL characters")
        return value


def turn_view(turn: Turn, pending: Action | None = None) -> dict[str, Any]:
    return {
        "id": turn.id,
        "state": turn.state,
        "user_seq": turn.user_seq,
        "assistant_message_id": turn.assistant_message_id,
        "pending_action": action_view(pending) if pending is not None else None,
        "created_at": turn.created_at.isoformat(),
        "updated_at": turn.updated_at.isoformat(),
    }


def session_summary(session: ChatSession) -> dict[str, Any]:
    return {
        "id": session.id,
        "last_seq": session.last_seq,
        "created_at": session.created_at.isoformat(),
    }


def message_view(message: Message) -> dict[str, Any]:
    return message_payload(message)


def events_url(session_id: str, turn_id: str) -> str:
    return f"/v1/sessions/{session_id}/turns/{turn_id}/events"
