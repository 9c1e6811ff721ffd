"""Parley's turns in the AI SDK's UI message stream protocol (the `ai` package, v7), so that
`useChat` and the `ai` client (`DefaultChatTransport`, `readUIMessageStream`, `Chat`) talk to
Parley with no adapter of their own (docs/features/ai-sdk.md).

Pure: the request's shape, what of it Parley uses, and the translation of a turn's stored
events (api.md) into UI message chunks. The routes (api/routes/ai_sdk.py) read the events
from the same log and doorbell as the SSE stream and write what this module makes.

What the protocol's client expects, read from its source (ai 7.0.185):
- the response is SSE, each chunk one `data:` frame of JSON, the stream ending with
  `data: [DONE]`, under the header `x-vercel-ai-ui-message-stream: v1`;
- a `text-delta` or `text-end` needs its `text-start` first, or the client throws;
- a tool's output, or its approval request, finds its tool part only within the current step
  (after the last `start-step`): so a step opens only where Parley calls the model, and the
  tool parts of a model call's tools (and of a confirmation) stay in that call's step;
- a resume (`GET .../{id}/stream`) is a replay: the client rebuilds the message from the
  first `start`; a continuation after an approval extends the message it names, so it opens
  with no new step.

One UI message is one turn: its id is the turn's id, so the message the client holds after a
confirmation names the turn to continue, and a replay rebuilds the same message. Parley's
assistant messages of the turn (one per model call) are its text parts, each under the
message's own id.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

# The response header the client's transport looks for (ui-message-stream-headers.ts).
STREAM_HEADERS = {
    "x-vercel-ai-ui-message-stream": "v1",
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",
}
# The stream's last frame (json-to-sse-transform-stream.ts).
DONE_FRAME = b"data: [DONE]\n\n"

Chunk = dict[str, Any]

# How a tool part ends for each answer to a card (parley/approvals.py statuses).
_DENIED = frozenset({"declined"})
_NOT_RUN = frozenset({"expired", "superseded"})


# --- the request --------------------------------------------------------------------------


class UIPartIn(BaseModel):
    """One part of a UI message as the client sends it; only text parts and answered
    approvals are read, anything else is kept as sent and ignored."""

    model_config = ConfigDict(extra="allow")

    type: str = Field(max_length=200)


class UIMessageIn(BaseModel):
    model_config = ConfigDict(extra="allow")

    id: str = Field(min_length=1, max_length=64)
    role: Literal["system", "user", "assistant"]
    parts: list[UIPartIn] = Field(default_factory=list, max_length=1000)


class ChatRequestIn(BaseModel):
    """The body `DefaultChatTransport` posts (http-chat-transport.ts): the chat's id (a
    Parley session id), its messages, why it sends, and the message it is about."""

    model_config = ConfigDict(extra="allow")

    id: str = Field(min_length=1, max_length=64)
    # The transport sends the whole history each time; Parley reads only the last message,
    # so a client may send just that (`prepareSendMessagesRequest`, docs/features/ai-sdk.md),
    # which keeps a long chat under the body limit.
    messages: list[UIMessageIn] = Field(min_length=1, max_length=1000)
    # `regenerate-message` is not taken: Parley answers a message again with
    # `POST .../turns/{id}/retry` (or `/regenerate`, on a new branch).
    trigger: Literal["submit-message"] = "submit-message"
    messageId: str | None = Field(default=None, max_length=64)  # noqa: N815 (the wire's name)


class UIStreamFrame(BaseModel):
    """One frame of the UI message stream: `data` is one chunk as JSON (its `type` first
    among its fields: `start`, `text-delta`, `tool-approval-request`, `data-clarification`…),
    the last frame's is `[DONE]`. A quiet stream also sends keep-alive comments."""

    data: str


def message_text(message: UIMessageIn) -> str:
    """A user message's text: its text parts, joined."""
    texts = [(part.model_extra or {}).get("text") for part in message.parts if part.type == "text"]
    return "".join(t for t in texts if isinstance(t, str))


def approval_answers(message: UIMessageIn) -> list[tuple[str, bool]]:
    """The approvals the client answered in an assistant message (tool parts in the state
    `approval-responded`): (approval id, approved), in order. Parley's approval id is the
    action's id."""
    answered: list[tuple[str, bool]] = []
    for part in message.parts:
        extra = part.model_extra or {}
        approval = extra.get("approval")
        if extra.get("state") != "approval-responded" or not isinstance(approval, dict):
            continue
        approval_id, approved = approval.get("id"), approval.get("approved")
        if isinstance(approval_id, str) and isinstance(approved, bool):
            answered.append((approval_id, approved))
    return answered


# --- the stream ---------------------------------------------------------------------------


class TurnChunks:
    """One turn's events (`type`, `data` as stored) as UI message chunks. Feed it the events
    in log order; it keeps what the protocol needs to know between them (the open step and
    text part, the tool parts shown)."""

    def __init__(self, *, session_id: str, turn_id: str) -> None:
        self._session_id = session_id
        self._turn_id = turn_id
        self._step_open = False
        self._text: str | None = None  # the Parley message whose text part is open
        self._tools: set[str] = set()  # tool parts shown (call ids; an action's id)
        self.finished = False

    def start(self) -> list[Chunk]:
        metadata = {"session_id": self._session_id, "turn_id": self._turn_id}
        return [{"type": "start", "messageId": self._turn_id, "messageMetadata": metadata}]

    def event(self, type_: str, data: Mapping[str, Any]) -> list[Chunk]:
        """The chunks of one stored event; none for what the protocol has no place for."""
        handler = getattr(self, "_on_" + type_, None)
        if handler is None:
            return []
        chunks: list[Chunk] = handler(data)
        return chunks

    def end(self, reason: str = "other") -> list[Chunk]:
        """Close what is open and finish the message (once)."""
        if self.finished:
            return []
        self.finished = True
        return [*self._close_step(), {"type": "finish", "finishReason": reason}]

    # -- steps and text

    def _close_text(self) -> list[Chunk]:
        if self._text is None:
            return []
        closed, self._text = self._text, None
        return [{"type": "text-end", "id": closed}]

    def _close_step(self) -> list[Chunk]:
        chunks = self._close_text()
        if self._step_open:
            self._step_open = False
            chunks.append({"type": "finish-step"})
        return chunks

    def _open_step(self) -> list[Chunk]:
        if self._step_open:
            return []
        self._step_open = True
        return [{"type": "start-step"}]

    def _on_state(self, data: Mapping[str, Any]) -> list[Chunk]:
        # Each model call is a step; tools and confirmations stay in the step that asked.
        if data.get("state") == "calling_model":
            return [*self._close_step(), *self._open_step()]
        return []

    def _on_delta(self, data: Mapping[str, Any]) -> list[Chunk]:
        message_id = str(data["message_id"])
        chunks = self._open_step()
        if self._text != message_id:
            chunks += self._close_text()
            # The UI's text part keeps no chunk id; its provider metadata names the message.
            parley = {"parley": {"message_id": message_id}}
            chunks.append({"type": "text-start", "id": message_id, "providerMetadata": parley})
            self._text = message_id
        chunks.append({"type": "text-delta", "id": message_id, "delta": str(data["text"])})
        return chunks

    def _on_reset(self, data: Mapping[str, Any]) -> list[Chunk]:
        # The model call is retried: what it streamed goes (the step holds only that call's
        # text so far), the step stays open for the retry.
        self._text = None
        return [{"type": "reset-step"}]

    # -- tools and confirmations

    def _on_tool(self, data: Mapping[str, Any]) -> list[Chunk]:
        call_id, label = str(data["call_id"]), str(data.get("label") or "")
        chunks = self._close_text()
        if data.get("phase") == "start":
            if call_id in self._tools:  # a confirmed action's send: its part is shown
                return chunks
            self._tools.add(call_id)
            return [*chunks, *self._open_step(), _tool_input(call_id, str(data["name"]), label)]
        if call_id not in self._tools:  # an end whose start came before a resume point
            self._tools.add(call_id)
            chunks += [*self._open_step(), _tool_input(call_id, str(data["name"]), label)]
        status = str(data.get("status") or "ok")
        if status == "ok":
            output = {"status": status, "label": label}
            return [
                *chunks,
                {"type": "tool-output-available", "toolCallId": call_id, "output": output},
            ]
        return [*chunks, {"type": "tool-output-error", "toolCallId": call_id, "errorText": status}]

    def _on_confirmation_required(self, data: Mapping[str, Any]) -> list[Chunk]:
        action = data["action"]
        action_id = str(action["id"])
        chunks = [*self._close_text(), *self._open_step()]
        if action_id not in self._tools:
            self._tools.add(action_id)
            card = {
                "summary": action.get("summary"),
                "recipient_masked": action.get("recipient_masked"),
                "attachment": action.get("attachment"),
                "expires_at": action.get("expires_at"),
            }
            chunks.append(
                {
                    "type": "tool-input-available",
                    "toolCallId": action_id,
                    "toolName": str(action["tool"]),
                    "input": {k: v for k, v in card.items() if v is not None},
                    "title": str(action.get("summary") or action["tool"]),
                    "dynamic": True,
                }
            )
        chunks.append(
            {"type": "tool-approval-request", "approvalId": action_id, "toolCallId": action_id}
        )
        chunks.append(_data("action", dict(action), part_id=action_id))
        return chunks

    def _on_confirmation_resolved(self, data: Mapping[str, Any]) -> list[Chunk]:
        action = data["action"]
        action_id, status = str(action["id"]), str(action["status"])
        chunks: list[Chunk] = [_data("action", dict(action), part_id=action_id)]
        if action_id not in self._tools:
            return chunks
        if status in _DENIED:
            chunks.insert(
                0, {"type": "tool-approval-response", "approvalId": action_id, "approved": False}
            )
            chunks.insert(1, {"type": "tool-output-denied", "toolCallId": action_id})
        elif status in _NOT_RUN:
            chunks.insert(
                0, {"type": "tool-output-error", "toolCallId": action_id, "errorText": status}
            )
        else:  # confirmed: the send's own tool events follow
            chunks.insert(
                0, {"type": "tool-approval-response", "approvalId": action_id, "approved": True}
            )
        return chunks

    def _on_confirmation_expiring(self, data: Mapping[str, Any]) -> list[Chunk]:
        action = data["action"]
        return [_data("action", dict(action), part_id=str(action["id"]))]

    # -- what has no standard part

    def _on_clarification(self, data: Mapping[str, Any]) -> list[Chunk]:
        return [_data("clarification", dict(data))]

    def _on_interaction(self, data: Mapping[str, Any]) -> list[Chunk]:
        return [_data("interaction", dict(data), part_id=str(data["interaction_id"]))]

    def _on_warning(self, data: Mapping[str, Any]) -> list[Chunk]:
        return [_data("warning", dict(data))]

    def _on_followups(self, data: Mapping[str, Any]) -> list[Chunk]:
        return [_data("followups", dict(data))]

    def _on_citations(self, data: Mapping[str, Any]) -> list[Chunk]:
        return [_data("citations", dict(data), part_id=str(data["message_id"]))]

    def _on_artifact(self, data: Mapping[str, Any]) -> list[Chunk]:
        return [_data("artifact", dict(data), part_id=str(data["file_id"]))]

    def _on_subagent(self, data: Mapping[str, Any]) -> list[Chunk]:
        return [_data("subagent", dict(data))]

    def _on_retracted(self, data: Mapping[str, Any]) -> list[Chunk]:
        return [_data("retracted", dict(data), part_id=str(data["message_id"]))]

    def _on_steered(self, data: Mapping[str, Any]) -> list[Chunk]:
        return [_data("steered", dict(data))]

    # -- endings

    def _on_done(self, data: Mapping[str, Any]) -> list[Chunk]:
        return [*self._ending(data), *self.end("stop")]

    def _on_cancelled(self, data: Mapping[str, Any]) -> list[Chunk]:
        return [*self._ending(data), *self.end("other")]

    def _on_error(self, data: Mapping[str, Any]) -> list[Chunk]:
        # The code and whether a retry may help go first: the `ai` client stops reading at
        # the error part (its `Chat` throws there), so a part after it would never be shown.
        ended = _data("error", dict(data))
        error = {"type": "error", "errorText": str(data.get("message") or data.get("code"))}
        return [*self._close_text(), ended, error, *self.end("error")]

    def _ending(self, data: Mapping[str, Any]) -> list[Chunk]:
        """The turn's final message, as metadata: its id and status (`cancelled` on a Stop)."""
        message = data.get("message") or {}
        metadata = {
            "session_id": self._session_id,
            "turn_id": self._turn_id,
            "message_id": message.get("id"),
            "status": message.get("status"),
        }
        return [*self._close_text(), {"type": "message-metadata", "messageMetadata": metadata}]


def _tool_input(call_id: str, name: str, label: str) -> Chunk:
    # `dynamic`: the client has no definition of Parley's tools; Parley runs them, the client
    # only shows them (it has nothing to execute: no tool part ever waits on the client).
    return {
        "type": "tool-input-available",
        "toolCallId": call_id,
        "toolName": name,
        "input": {},
        "title": label,
        "dynamic": True,
    }


def _data(name: str, data: dict[str, Any], *, part_id: str | None = None) -> Chunk:
    chunk: Chunk = {"type": f"data-{name}", "data": data}
    if part_id is not None:
        chunk["id"] = part_id
    return chunk


def resting_end(last_type: str | None) -> str | None:
    """The finish reason of a stream that ends with the turn resting on the user (a card,
    a specialist's question), or None when the turn has not come to rest."""
    if last_type == "confirmation_required":
        return "tool-calls"
    if last_type == "interaction":
        return "other"
    return None
