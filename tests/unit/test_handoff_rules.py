"""A tenant's hand-off rules (parley/handoff_rules.py): which words ask for a person, when a
policy opens a case, and a case's priority."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from parley.handoff_rules import (
    ASK_PHRASES_EN,
    HandoffRules,
    OpenedBy,
    asks_for_person,
    policy_reason,
)
from parley.tenancy import TenantConfig


@pytest.mark.parametrize(
    "text",
    [
        "I want to talk to a person",
        "Can I speak to a human please?",
        "Let me talk to a real person.",
        "REAL PERSON!!",
        "No, I'd like to speak with a human",
        "This is useless. Talk to someone, now",
        "Where is my order? I want a real person",
    ],
)
def test_plain_requests_for_a_person_are_heard(text: str) -> None:
    assert asks_for_person(text, ASK_PHRASES_EN)


@pytest.mark.parametrize(
    "text",
    [
        "Where is my order?",
        "I don't want to talk to a person, just tell me the status",
        "No need to speak to a human",
        "Is the person who signed for it my neighbour?",
        "Could a representative help me?",  # the model's to decide (it may call the tool)
        "talk. To a person",  # words of two sentences
        "",
    ],
)
def test_other_messages_are_left_to_the_model(text: str) -> None:
    assert not asks_for_person(text, ASK_PHRASES_EN)


def test_a_tenant_names_its_own_phrases_or_turns_the_check_off() -> None:
    french = HandoffRules(ask_phrases=["parler à un conseiller"])
    assert asks_for_person("Je veux parler à un vrai conseiller", french.phrases())
    assert not asks_for_person("I want to talk to a person", french.phrases())
    assert HandoffRules(ask_phrases=[]).phrases() == ()
    assert HandoffRules().phrases() == ASK_PHRASES_EN


def test_a_policy_opens_a_case_at_its_thresholds_only() -> None:
    rules = HandoffRules()  # 3 outages in a row, 2 retractions
    assert policy_reason(rules, outages=2, retractions=1) is None
    outages = policy_reason(rules, outages=3, retractions=0)
    assert outages is not None and "did not answer the assistant's last 3 lookups" in outages
    retracted = policy_reason(rules, outages=0, retractions=2)
    assert retracted is not None and "withdrew 2 of the assistant's answers" in retracted
    off = HandoffRules(tool_outages=0, retractions=0)
    assert policy_reason(off, outages=0, retractions=9) is None
    assert policy_reason(off, outages=9, retractions=0) is None


def test_a_case_priority_comes_from_its_opener_and_the_tenants_words() -> None:
    rules = HandoffRules()
    assert rules.priority(OpenedBy.tool, "the customer is upset") == 1
    assert rules.priority(OpenedBy.user_asked, "a person please") == 1
    assert rules.priority(OpenedBy.policy, "outages") == 2
    tenant = HandoffRules(priorities={"tool": 0, "policy": 5}, urgent_words=["legal action"])
    assert tenant.priority(OpenedBy.tool, "a refund question") == 0
    assert tenant.priority(OpenedBy.tool, "They threaten LEGAL action") == 1
    assert tenant.priority(OpenedBy.user_asked, "legal action") == 2  # the default 1, plus one
    assert (
        HandoffRules(priorities={"policy": 9}, urgent_words=["x"]).priority(OpenedBy.policy, "x")
        == 9
    )  # never past the top


def test_the_rules_are_checked_as_a_tenant_config_is_saved() -> None:
    saved = TenantConfig.model_validate(
        {"handoff_rules": {"tool_outages": 5, "priorities": {"policy": 3}}}
    )
    assert saved.handoffs().tool_outages == 5 and saved.handoffs().retractions == 2
    assert TenantConfig().handoffs() == HandoffRules()
    for wrong in (
        {"priorities": {"boss": 1}},
        {"tool_outages": -1},
        {"retractions": "2"},
        {"ask_phrases": "talk to a person"},
    ):
        with pytest.raises(ValidationError):
            TenantConfig.model_validate({"handoff_rules": wrong})
