"""Pure domain rules: the reference resolver, the breaker, typed consent, the tool registry."""

from __future__ import annotations

import pytest

from parley.breaker import BreakerState, CircuitBreaker
from parley.consent import typed_decision
from parley.resolver import (
    ACTIVE_ORDER,
    PENDING_CLARIFICATION,
    Entity,
    NeedsCandidates,
    Slot,
    resolve,
)
from parley.tools import TOOLS, Risk, ToolError, args_hash, model_tools, parse_arguments

PRIYA = [
    Entity("order", "8472", "8472"),
    Entity("order", "8390", "8390"),
    Entity("refund", "R-5530", "8472"),
    Entity("refund", "R-5102", "8390"),
]


def active(order_id: str, seq: int = 1, source: str = "tool:list_open_orders") -> dict[str, Slot]:
    return {ACTIVE_ORDER: Slot(order_id, source, seq)}


def test_a_stated_order_id_wins_over_the_slot_and_moves_it() -> None:
    r = resolve("What about order 8390?", slots=active("8472"), user_seq=5)
    assert (r.kind, r.order_id) == ("stated", "8390")
    assert r.slot_writes[ACTIVE_ORDER] == Slot("8390", "user_stated", 5)


def test_a_stated_refund_id_resolves_to_its_order() -> None:
    with pytest.raises(NeedsCandidates):
        resolve("And R-5102?", slots=active("8472"), user_seq=5)
    r = resolve("And R-5102?", slots=active("8472"), user_seq=5, entities=PRIYA)
    assert (r.kind, r.order_id, r.entity_type) == ("stated", "8390", "refund")


def test_a_fresh_slot_is_used_and_not_rewritten() -> None:
    r = resolve("What about the refund?", slots=active("8472", seq=1), user_seq=3)
    assert (r.kind, r.order_id, r.slot_writes) == ("slot", "8472", {})


def test_a_stale_slot_is_not_trusted() -> None:
    stale = active("8472", seq=1)
    with pytest.raises(NeedsCandidates):
        resolve("What about the refund?", slots=stale, user_seq=40)
    r = resolve("What about the refund?", slots=stale, user_seq=40, entities=PRIYA)
    assert r.kind == "clarify"  # two orders: ask, don't guess


def test_the_other_one_with_two_candidates_of_different_types_asks_once() -> None:
    r = resolve("Thanks. And the other one?", slots=active("8472"), user_seq=9, entities=PRIYA)
    assert r.kind == "clarify" and r.order_id is None
    assert r.clarification is not None
    assert [(o.label, o.type) for o in r.clarification.options] == [
        ("Order 8390", "order"),
        ("Refund R-5102", "refund"),
    ]
    assert r.clarification.question == "Which one do you mean: order 8390 or refund R-5102?"


def test_the_other_one_with_one_candidate_proceeds_and_says_so() -> None:
    entities = [Entity("order", "8472", "8472"), Entity("order", "8390", "8390")]
    r = resolve("and the other one?", slots=active("8472"), user_seq=9, entities=entities)
    assert (r.kind, r.order_id) == ("single_candidate", "8390")
    assert r.assumption == "Assuming you mean order 8390."
    assert r.slot_writes[ACTIVE_ORDER].source == "single_candidate"


def test_picking_an_option_resolves_and_clears_the_question() -> None:
    asked = resolve("And the other one?", slots=active("8472"), user_seq=9, entities=PRIYA)
    assert asked.clarification is not None
    slots = {
        **active("8472"),
        PENDING_CLARIFICATION: Slot(asked.clarification.as_slot_value(), "resolver", 9),
    }
    r = resolve("The order. Can I still return it?", slots=slots, user_seq=11)
    assert (r.kind, r.order_id) == ("clarified", "8390")
    assert r.slot_writes[ACTIVE_ORDER] == Slot("8390", "clarification", 11)
    assert PENDING_CLARIFICATION in r.slot_clears
    refund = resolve("the refund please", slots=slots, user_seq=11)
    assert (refund.kind, refund.order_id, refund.entity_type) == ("clarified", "8390", "refund")


def test_an_ambiguous_pick_does_not_resolve() -> None:
    asked = resolve("the other one", slots=active("8472"), user_seq=9, entities=PRIYA)
    assert asked.clarification is not None
    slots = {
        **active("8472"),
        PENDING_CLARIFICATION: Slot(asked.clarification.as_slot_value(), "r", 9),
    }
    r = resolve("the order or the refund, whichever", slots=slots, user_seq=11)
    assert r.kind == "slot"  # neither option alone; falls back to the fresh slot


def test_where_is_my_order_without_a_slot_leaves_it_to_the_tools() -> None:
    assert resolve("Where is my order?", slots={}, user_seq=1).kind == "none"


def test_the_breaker_opens_after_failures_and_half_opens_after_cooldown() -> None:
    now = [0.0]
    breaker = CircuitBreaker(failure_threshold=3, cooldown_s=10, clock=lambda: now[0])
    for _ in range(3):
        assert breaker.allow()
        breaker.record_failure()
    assert breaker.state == BreakerState.open and not breaker.allow()
    now[0] = 10.0
    assert breaker.state == BreakerState.half_open
    assert breaker.allow() and not breaker.allow()  # one trial call at a time
    breaker.record_failure()  # the trial failed: open again for a full cooldown
    assert breaker.state == BreakerState.open
    now[0] = 20.0
    assert breaker.allow()
    breaker.record_success()
    assert breaker.state == BreakerState.closed and breaker.allow()


@pytest.mark.parametrize(
    ("text", "decision"),
    [
        ("yes", "confirmed"),
        ("Yes, send it!", "confirmed"),
        ("confirm", "confirmed"),
        ("no", "declined"),
        ("No thanks.", "declined"),
        ("don't send it", "declined"),
        ("yes but to my work address", None),
        ("What about the other one?", None),
        ("yesterday", None),
    ],
)
def test_only_plain_yes_or_no_counts_as_consent(text: str, decision: str | None) -> None:
    assert typed_decision(text) == decision


def test_the_model_is_offered_no_write_tool_and_no_customer_argument() -> None:
    offered = {t["name"]: t for t in model_tools()}
    assert "send_email" not in offered
    assert TOOLS["send_email"].risk == Risk.write
    for tool in offered.values():
        assert "customer_id" not in tool["parameters"].get("properties", {})
    assert offered["propose_email"]["parameters"]["additionalProperties"] is False


@pytest.mark.parametrize(
    ("name", "raw", "code"),
    [
        ("get_order", '{"order_id": 8472}', "invalid_arguments"),
        ("get_order", '{"order_id": "8472", "customer_id": "cust_3301"}', "invalid_arguments"),
        ("get_order", '{"order_id": "84', "invalid_arguments"),
        ("get_order", "[1, 2]", "invalid_arguments"),
        (
            "propose_email",
            '{"order_id": "8472", "template": "x", "to": "a@b.c"}',
            "invalid_arguments",
        ),
        ("send_email", '{"action_id": "act_1"}', "refused"),
        ("drop_tables", "{}", "unknown_tool"),
    ],
)
def test_bad_arguments_become_structured_errors(name: str, raw: str, code: str) -> None:
    result = parse_arguments(name, raw)
    assert isinstance(result, ToolError) and result.code == code


def test_args_hash_is_canonical() -> None:
    assert args_hash("get_order", {"a": 1, "b": 2}) == args_hash("get_order", {"b": 2, "a": 1})
    assert args_hash("get_order", {"a": 1}) != args_hash("get_refund", {"a": 1})
