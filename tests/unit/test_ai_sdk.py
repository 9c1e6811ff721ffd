"""Parley's turn events as the AI SDK's UI message chunks (parley/ai_sdk.py): the order the
`ai` client needs (a text part opened before its deltas, a tool's output and approval in the
step of its call, one finish), and what of a request Parley reads."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from parley.ai_sdk import (
    ChatRequestIn,
    TurnChunks,
    approval_answers,
    message_text,
    resting_end,
)
from parley.wire import EVENT_DATA

REPO = Path(__file__).resolve().parents[2]
FEATURE_PAGE = REPO / "docs" / "features" / "ai-sdk.md"

ACTION = {
    "id": "act_1",
    "turn_id": "trn_1",
    "tool": "send_email",
    "summary": "Email the status of order 8472",
    "recipient_masked": "p***@example.com",
    "args_hash": "h",
    "status": "pending",
    "expires_at": "2026-10-28T10:00:00+00:00",
}


def run(events: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    chunks = TurnChunks(session_id="ses_1", turn_id="trn_1")
    out = chunks.start()
    for type_, data in events:
        out += chunks.event(type_, data)
    return out + chunks.end("other")


def types(chunks: list[dict[str, Any]]) -> list[str]:
    return [c["type"] for c in chunks]


def state(name: str) -> tuple[str, dict[str, Any]]:
    return "state", {"state": name}


def delta(text: str, message_id: str = "msg_2") -> tuple[str, dict[str, Any]]:
    return "delta", {"message_id": message_id, "text": text}


def done(message_id: str = "msg_2", status: str = "complete") -> tuple[str, dict[str, Any]]:
    return "done", {"message": {"id": message_id, "status": status}}


def tool(phase: str, status: str | None = None) -> tuple[str, dict[str, Any]]:
    data = {"call_id": "call_1", "name": "list_open_orders", "phase": phase, "label": "Looking"}
    return "tool", data | ({"status": status} if status else {})


def test_a_turn_with_a_tool_is_two_steps_and_one_text_part_under_its_message_id() -> None:
    chunks = run(
        [
            state("received"),
            state("calling_model"),
            tool("start"),
            state("executing_tools"),
            tool("end", "ok"),
            state("calling_model"),
            delta("Your order "),
            delta("has shipped."),
            done(),
        ]
    )
    assert types(chunks) == [
        "start",
        "start-step",
        "tool-input-available",
        "tool-output-available",
        "finish-step",
        "start-step",
        "text-start",
        "text-delta",
        "text-delta",
        "text-end",
        "message-metadata",
        "finish-step",
        "finish",
    ]
    assert chunks[0]["messageId"] == "trn_1"
    assert chunks[2]["dynamic"] is True and chunks[2]["title"] == "Looking"
    assert chunks[6]["id"] == "msg_2"
    assert chunks[6]["providerMetadata"] == {"parley": {"message_id": "msg_2"}}
    assert chunks[-3]["messageMetadata"]["status"] == "complete"
    assert chunks[-1] == {"type": "finish", "finishReason": "stop"}


def test_a_failed_tool_is_an_output_error() -> None:
    chunks = run([state("calling_model"), tool("start"), tool("end", "error"), done()])
    assert {"type": "tool-output-error", "toolCallId": "call_1", "errorText": "error"} in chunks


def test_a_reset_drops_the_step_and_the_retry_opens_its_text_again() -> None:
    chunks = run(
        [
            state("calling_model"),
            delta("Half"),
            ("reset", {"message_id": "msg_2", "reason": "retry"}),
            delta("Whole."),
            done(),
        ]
    )
    assert types(chunks)[:7] == [
        "start",
        "start-step",
        "text-start",
        "text-delta",
        "reset-step",
        "text-start",
        "text-delta",
    ]


def test_a_card_is_an_approval_request_on_its_own_tool_part_and_the_stream_rests() -> None:
    events = [
        state("calling_model"),
        delta("Shall I?"),
        ("confirmation_required", {"action": ACTION}),
    ]
    chunks = run(events)
    request = next(c for c in chunks if c["type"] == "tool-approval-request")
    shown = next(c for c in chunks if c["type"] == "tool-input-available")
    assert request == {
        "type": "tool-approval-request",
        "approvalId": "act_1",
        "toolCallId": "act_1",
    }
    assert shown["toolName"] == "send_email"
    assert shown["input"]["recipient_masked"] == "p***@example.com"
    # The text closes before the card; no step opens between the card and the rest.
    assert types(chunks).index("text-end") < types(chunks).index("tool-input-available")
    assert "start-step" not in types(chunks)[types(chunks).index("tool-input-available") :]
    assert resting_end("confirmation_required") == "tool-calls"
    assert resting_end("done") is None


def test_a_confirmed_card_sends_in_the_same_step_then_the_answer_is_a_new_step() -> None:
    chunks = TurnChunks(session_id="ses_1", turn_id="trn_1")
    for type_, data in [state("calling_model"), ("confirmation_required", {"action": ACTION})]:
        chunks.event(type_, data)
    confirmed = {"action": ACTION | {"status": "confirmed"}}
    sending = {"call_id": "act_1", "name": "send_email", "label": "Sending", "phase": "start"}
    sent = sending | {"phase": "end", "status": "ok"}
    out: list[dict[str, Any]] = []
    for type_, data in [
        ("confirmation_resolved", confirmed),
        state("executing_action"),
        ("tool", sending),
        ("tool", sent),
        state("calling_model"),
        delta("Sent."),
        done(),
    ]:
        out += chunks.event(type_, data)
    assert types(out)[:4] == [
        "tool-approval-response",
        "data-action",
        "tool-output-available",
        "finish-step",
    ]
    assert out[0] == {"type": "tool-approval-response", "approvalId": "act_1", "approved": True}
    assert out[2]["toolCallId"] == "act_1"


def test_a_declined_card_is_denied() -> None:
    chunks = run(
        [
            state("calling_model"),
            ("confirmation_required", {"action": ACTION}),
            ("confirmation_resolved", {"action": ACTION | {"status": "declined"}}),
        ]
    )
    assert {"type": "tool-output-denied", "toolCallId": "act_1"} in chunks


def test_what_has_no_standard_part_is_a_data_part() -> None:
    clarification = {
        "question": "Which one?",
        "options": [{"label": "Order 8390", "value": "8390"}],
    }
    chunks = run(
        [
            ("clarification", clarification),
            ("followups", {"suggestions": ["And the refund?"]}),
            ("warning", {"code": "context_trimmed", "message": "m"}),
            ("citations", {"message_id": "msg_2", "sources": []}),
        ]
    )
    assert {"type": "data-clarification", "data": clarification} in chunks
    assert {"type", "data"} <= set(chunks[2])
    assert [c["type"] for c in chunks if c["type"].startswith("data-")] == [
        "data-clarification",
        "data-followups",
        "data-warning",
        "data-citations",
    ]


def test_an_error_is_the_protocols_error_part_and_finishes_once() -> None:
    error = {"code": "model_unavailable", "message": "The model is unavailable.", "retryable": True}
    chunks = run([state("calling_model"), delta("Hal"), ("error", error)])
    # The data part first: the `ai` client reads nothing after the error part.
    assert types(chunks)[-5:] == ["text-end", "data-error", "error", "finish-step", "finish"]
    assert chunks[-4]["data"] == error
    assert chunks[-3]["errorText"] == "The model is unavailable."
    assert chunks[-1]["finishReason"] == "error"
    assert types(chunks).count("finish") == 1


def test_a_cancelled_turn_ends_with_its_message_status() -> None:
    chunks = run(
        [state("calling_model"), delta("Half"), ("cancelled", done(status="cancelled")[1])]
    )
    metadata = next(c for c in chunks if c["type"] == "message-metadata")
    assert metadata["messageMetadata"]["status"] == "cancelled"


def test_the_request_gives_the_new_user_text_and_the_answered_approvals() -> None:
    body = ChatRequestIn.model_validate(
        {
            "id": "ses_1",
            "trigger": "submit-message",
            "messages": [
                {
                    "id": "u1",
                    "role": "user",
                    "parts": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}],
                },
                {
                    "id": "trn_1",
                    "role": "assistant",
                    "parts": [
                        {"type": "step-start"},
                        {
                            "type": "dynamic-tool",
                            "toolCallId": "a",
                            "state": "approval-responded",
                            "approval": {"id": "act_1", "approved": True},
                        },
                        {
                            "type": "dynamic-tool",
                            "toolCallId": "b",
                            "state": "approval-requested",
                            "approval": {"id": "act_2"},
                        },
                        {
                            "type": "dynamic-tool",
                            "toolCallId": "c",
                            "state": "approval-responded",
                            "approval": {"id": "act_3", "approved": False},
                        },
                    ],
                },
            ],
        }
    )
    assert message_text(body.messages[0]) == "Hi there"
    assert approval_answers(body.messages[1]) == [("act_1", True), ("act_3", False)]
    assert approval_answers(body.messages[0]) == []


def test_the_docs_map_every_event_and_their_use_chat_example_is_the_pages_code() -> None:
    page = FEATURE_PAGE.read_text()
    mapped = set(re.findall(r"^\| `([a-z_]+)`", page, flags=re.MULTILINE))
    assert set(EVENT_DATA) <= mapped, set(EVENT_DATA) - mapped
    example = re.search(
        r"<!-- useChat example: begin -->\n```jsx\n(.*?)```\n<!-- useChat example: end -->",
        page,
        flags=re.DOTALL,
    )
    assert example is not None
    source = (REPO / "examples" / "use-chat" / "src" / "main.jsx").read_text()
    indented = "".join(f"  {line}" if line else line for line in example[1].splitlines(True))
    assert indented in source
