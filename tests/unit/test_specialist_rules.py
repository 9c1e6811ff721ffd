"""The specialist's pure rules: how a typed answer picks an option, who is offered the
delegation, the states a delegated turn moves through, and the demo model's hand-over."""

from __future__ import annotations

import pytest

from gateway.demo_returns import next_step
from parley.contracts import TurnState
from parley.specialists import (
    CLOSING_TEXT,
    DELEGATE_RETURNS,
    REASONS,
    SpecialistOutcome,
    closing_text,
    match_option,
)
from parley.tenancy import TenantConfig
from parley.tools import model_tools
from parley.turn_states import can_move
from parley.wire import Option

ITEMS = [
    Option(label="Trail Runner shoes, size 8", value="8390-1"),
    Option(label="Wool socks (3-pack)", value="8390-2"),
]


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("8390-2", "8390-2"),
        ("Trail Runner shoes, size 8", "8390-1"),
        ("the shoes", "8390-1"),
        ("the socks please", "8390-2"),
        ("both of them?", ""),
        ("hmm", ""),
    ],
)
def test_a_typed_answer_picks_the_one_option_it_names(text: str, value: str) -> None:
    assert match_option(text, ITEMS) == value


def test_reasons_are_matched_by_their_words() -> None:
    assert match_option("it's too large for me", list(REASONS)) == "too_large"
    assert match_option("it arrived damaged", list(REASONS)) == "damaged"
    assert match_option("I changed my mind", list(REASONS)) == "changed_my_mind"
    assert match_option("too", list(REASONS)) == ""  # two options share the word


def test_delegation_is_offered_only_to_a_tenant_that_allows_specialists() -> None:
    names = [t["name"] for t in model_tools()]
    assert DELEGATE_RETURNS in names and "create_return" not in names  # a write is never offered
    assert not TenantConfig().offered(DELEGATE_RETURNS)
    assert TenantConfig(specialists=True).offered(DELEGATE_RETURNS)
    narrowed = TenantConfig(specialists=True, tool_allowlist=["get_order"])
    assert not narrowed.offered(DELEGATE_RETURNS)


def test_a_delegated_turn_rests_on_questions_and_cards_and_can_always_end() -> None:
    path = [
        TurnState.executing_tools,
        TurnState.awaiting_input,
        TurnState.executing_tools,
        TurnState.awaiting_input,
        TurnState.executing_tools,
        TurnState.awaiting_confirmation,
        TurnState.executing_action,
        TurnState.completed,
    ]
    assert all(can_move(a, b) for a, b in zip(path, path[1:], strict=False))
    for ending in (TurnState.completed, TurnState.cancelled, TurnState.failed):
        assert can_move(TurnState.awaiting_input, ending)
    assert not can_move(TurnState.awaiting_input, TurnState.calling_model)


def test_the_closing_words_name_the_rma_only_when_the_return_exists() -> None:
    assert "RMA-100001" in closing_text(SpecialistOutcome.created, "RMA-100001")
    assert closing_text(SpecialistOutcome.timed_out, "RMA-1") == CLOSING_TEXT["timed_out"]
    assert closing_text("something else") == CLOSING_TEXT["failed"]


def test_the_demo_hands_over_only_when_the_tool_is_offered() -> None:
    offered = [{"name": DELEGATE_RETURNS}]
    ask = "I want to return something from order 8390."
    step = next_step(offered, ask, {})
    assert step is not None and step.tool == DELEGATE_RETURNS
    assert step.arguments == {"order_id": "8390"}
    assert next_step([], ask, {}) is None
    assert next_step(offered, "Can I return order 8390?", {}) is None
    failed = next_step(offered, ask, {DELEGATE_RETURNS: {"error": {"code": "not_found"}}})
    assert failed is not None and "couldn't find" in failed.text
