"""The model-driven specialist's pure rules (parley/returns_agent.py): which tool calls run
and what a refused one is told, and the request its next model call is sent."""

from __future__ import annotations

import json

import pytest

from parley.returns_agent import (
    AGENT_INSTRUCTIONS,
    AGENT_TOOLS,
    EMPTY_REPLY,
    PastStep,
    agent_messages,
    agent_tool_schemas,
    check_call,
)
from parley.specialists import REASONS

OPTIONS = [{"label": "Shoes", "value": "8390-1"}, {"label": "Socks", "value": "8390-2"}]


def test_a_well_formed_question_and_proposal_run() -> None:
    args, problem = check_call("ask_user", {"question": "Which one?", "options": OPTIONS})
    assert problem == "" and args == {"question": "Which one?", "options": OPTIONS}
    proposal = {"order_id": "8390", "item_id": "8390-1", "reason": "too_small"}
    assert check_call("propose_return", proposal) == (proposal, "")


@pytest.mark.parametrize(
    ("name", "arguments", "told"),
    [
        ("ask_user", '{"question": "Which', "not a JSON object"),
        ("ask_user", {"question": "Which one?"}, "options: Field required"),
        ("ask_user", {"question": "Which one?", "options": OPTIONS[:1]}, "options"),
        ("ask_user", {"question": "Which?", "options": [{"label": "x"}]}, "value"),
        ("propose_return", {"order_id": "8390", "item_id": "1", "reason": "bored"}, "reason"),
        ("propose_return", {"order_id": "8390", "item_id": "1"}, "reason: Field required"),
        ("list_order_items", {"order_id": "8390", "customer": "marco"}, "customer"),
        ("create_return", {"order_id": "8390"}, "unknown tool 'create_return'"),
    ],
)
def test_a_call_that_does_not_check_is_refused_with_the_reason(
    name: str, arguments: object, told: str
) -> None:
    args, problem = check_call(name, arguments)
    assert args is None
    assert told in problem


def test_the_reasons_offered_are_the_ones_a_proposal_takes() -> None:
    for option in REASONS:
        proposal = {"order_id": "8390", "item_id": "8390-1", "reason": option.value}
        assert check_call("propose_return", proposal)[1] == ""
    assert {t["name"] for t in agent_tool_schemas()} == set(AGENT_TOOLS)


def test_every_call_of_the_past_gets_a_result_in_the_next_request() -> None:
    asked = {"id": "c1", "name": "ask_user", "arguments": {"question": "Q?", "options": OPTIONS}}
    broken = {"id": "c2", "name": "ask_user", "arguments": '{"question'}
    extra = {"id": "c3", "name": "list_order_items", "arguments": {"order_id": "8390"}}
    chosen = {"chosen": {"value": "8390-1", "label": "Shoes"}}
    past = [
        PastStep("", [asked, broken, extra], {"c1": chosen}),
        PastStep(""),  # neither words nor a call
    ]
    messages = agent_messages("8390", "I want to return something", past)
    assert messages[0] == {"role": "system", "content": AGENT_INSTRUCTIONS}
    assert "order 8390" in messages[1]["content"]
    results = {m["tool_call_id"]: json.loads(m["content"]) for m in messages if m["role"] == "tool"}
    assert results["c1"] == chosen
    assert "not a JSON object" in results["c2"]["error"]
    assert results["c3"]["error"].startswith("not run")
    assert messages[-1] == {"role": "user", "content": EMPTY_REPLY}
