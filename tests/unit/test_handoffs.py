"""The rules of a hand-off (parley/handoffs.py): the case summary's check and its code
fallback, the moves a case may make, and the demo model's summary."""

from __future__ import annotations

import json

import pytest

from parley.gateway.demo_handoff import case_summary
from parley.handoffs import (
    MOVES,
    CaseFacts,
    HandoffStatus,
    code_summary,
    parse_summary,
    summary_request,
)

FACTS = CaseFacts(
    reason="I want to talk to a person",
    order_id="8472",
    transcript=[
        {"role": "user", "text": "Where is my order?"},
        {"role": "assistant", "text": "Order 8472 shipped on Oct 26."},
        {"role": "user", "text": "What about the refund?"},
        {"role": "user", "text": "I want to talk to a person"},
    ],
    tools=["list_open_orders", "get_refund"],
)


@pytest.mark.parametrize(
    "answer",
    [
        "not json at all",
        '["a list"]',
        '{"summary": 42}',
        '{"summary": "short"}',
        '{"summary": "The customer is upset about a parcel and wants a person now."}',  # no order
        json.dumps({"summary": "x " * 2000}),
    ],
)
def test_an_unusable_model_summary_is_refused(answer: str) -> None:
    with pytest.raises(ValueError):
        parse_summary(answer, FACTS)


def test_the_code_summary_names_the_order_the_reason_and_what_was_asked() -> None:
    written = code_summary(FACTS)
    assert "Order in play: 8472" in written and "I want to talk to a person" in written
    assert "What about the refund?" in written and "get_refund" in written


def test_the_demo_models_summary_passes_the_check_and_names_the_refund_question() -> None:
    body = json.loads(summary_request(FACTS)[1]["content"])
    summary = parse_summary(case_summary(body), FACTS)
    assert "8472" in summary and "What about the refund?" in summary


def test_a_case_moves_only_forward_and_ends_once() -> None:
    assert MOVES[HandoffStatus.waiting] == {HandoffStatus.claimed}
    assert MOVES[HandoffStatus.claimed] == {HandoffStatus.resolved, HandoffStatus.handed_back}
    assert not MOVES[HandoffStatus.resolved] and not MOVES[HandoffStatus.handed_back]
