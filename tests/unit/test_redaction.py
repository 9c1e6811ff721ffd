"""The model-facing mask (parley/redaction.py): card numbers and email addresses in a prompt's
content and tool-call arguments, by the log filter's patterns; nothing else changes."""

from __future__ import annotations

from parley.redaction import redact_messages

CARD = "4111 1111 1111 1111"
ADDRESS = "priya.alt@example.org"


def test_the_mask_covers_content_and_tool_arguments_and_nothing_else() -> None:
    messages = [
        {"role": "user", "content": f"card {CARD}, mail {ADDRESS}, order 8472"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": "c1", "name": "lookup", "arguments": {"email": ADDRESS}}],
        },
        {"role": "tool", "content": '{"card": "5500-0000-0000-0004"}', "tool_call_id": "c1"},
    ]
    masked = redact_messages(messages)
    assert masked[0]["content"] == "card [card], mail [email], order 8472"
    assert masked[1]["tool_calls"][0] == {
        "id": "c1",
        "name": "lookup",
        "arguments": {"email": "[email]"},
    }
    assert masked[2] == {"role": "tool", "content": '{"card": "[card]"}', "tool_call_id": "c1"}
    assert messages[0]["content"].startswith("card 4111")  # the input is left as it was
