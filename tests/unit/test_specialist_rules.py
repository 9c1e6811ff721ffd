"""The specialist's pure rules: how a typed answer picks an option, who is offered the
delegation, the states a delegated turn moves through, and the demo model's hand-over."""

from __future__ import annotations

import pytest

from parley.contracts import TurnState
from parley.gateway.demo_returns import next_step
from parley.launch.seeding import demo_mcp_server, demo_tenant_config
from parley.specialists import (
    CLOSING_TEXT,
    DELEGATE_RETURNS,
    REASONS,
    SpecialistOutcome,
    closing_text,
    match_option,
    mentions_returning,
)
from parley.tenancy import TenantConfig
from parley.tool_offer import NO_RETURN, TurnShape, offer
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


@pytest.mark.parametrize(
    "message",
    [
        "I want to return something from order 8390.",
        "Can I still return it?",
        "How do returns work?",
        "I'd like to send the shoes back.",
        "Where is my RMA label?",
    ],
)
def test_a_message_about_returning_is_offered_the_hand_over(message: str) -> None:
    assert mentions_returning(message)
    tools = [t for t in model_tools() if TenantConfig(specialists=True).offered(t["name"])]
    assert DELEGATE_RETURNS in [t["name"] for t in offer(tools, TurnShape(message=message)).tools]


@pytest.mark.parametrize(
    "message",
    ["Where is my order?", "What about the refund?", "Can you email me?", "Send it to my email"],
)
def test_other_messages_do_not_carry_the_hand_over_schema(message: str) -> None:
    assert not mentions_returning(message)
    tools = [t for t in model_tools() if TenantConfig(specialists=True).offered(t["name"])]
    made = offer(tools, TurnShape(message=message))
    assert DELEGATE_RETURNS not in [t["name"] for t in made.tools]
    assert made.withheld[DELEGATE_RETURNS] == NO_RETURN
    # Once called, it stays offered for the follow-ups, like every other tool.
    lately = TurnShape(message=message, recently_used=frozenset({DELEGATE_RETURNS}))
    assert DELEGATE_RETURNS in [t["name"] for t in offer(tools, lately).tools]


def test_the_demo_seed_allows_specialists_unless_an_operator_said_no() -> None:
    seeded = demo_tenant_config(TenantConfig(persona="Be brief."), "http://backend:8100")
    assert seeded.specialists is True and seeded.offered(DELEGATE_RETURNS)
    assert seeded.skills == ["spending_chart"] and seeded.persona == "Be brief."
    assert seeded.mcp_servers == [demo_mcp_server("http://backend:8100")]
    # Seeding again (every `make run`) changes nothing; an explicit "off" is kept.
    assert demo_tenant_config(seeded, "http://backend:8100") == seeded
    off = demo_tenant_config(TenantConfig(specialists=False), "http://backend:8100")
    assert off.specialists is False


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
