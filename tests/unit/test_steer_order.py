"""A steer stored while tool calls ran comes after their results in every prompt (the history
has no tool call without its result), and only the steered turn's own messages are held."""

from __future__ import annotations

from parley.context import WindowMessage
from parley.prompt import split_current
from parley.store.steering import is_newer
from parley.window import group_turns, render_turn

CALLS = [{"id": "c1", "name": "get_order"}, {"id": "c2", "name": "get_refund"}]


def message(seq: int, role: str, text: str = "", turn: str = "t1", **more: object) -> WindowMessage:
    return WindowMessage(seq, role, text or f"{role} {seq}", "complete", turn_id=turn, **more)  # type: ignore[arg-type]


def steered_while_tools_ran() -> list[WindowMessage]:
    return [
        message(1, "user", "Where is my order?"),
        message(2, "assistant", "", tool_calls=CALLS),
        message(3, "user", "Only the refund, please"),  # the steer, stored mid-batch
        message(4, "tool", '{"order": 8472}', tool_call_id="c1"),
        message(5, "tool", '{"refund": "R-5530"}', tool_call_id="c2"),
    ]


def test_a_steer_stored_mid_batch_follows_the_batchs_results() -> None:
    turns = group_turns(steered_while_tools_ran())
    assert [[m.seq for m in t] for t in turns] == [[1, 2, 4, 5], [3]]
    _, current = split_current(steered_while_tools_ran(), user_seq=1)
    rendered = render_turn(current, aged=False, max_message_tokens=10**6, cut=lambda t, n: t)
    assert [m["role"] for m in rendered] == ["user", "assistant", "tool", "tool", "user"]
    assert rendered[1]["tool_calls"] == CALLS  # both calls kept: each has its result


def test_another_turns_message_is_not_held() -> None:
    # A call left without a result (a damaged record) never swallows the next turn.
    messages = [
        message(1, "user"),
        message(2, "assistant", "", tool_calls=CALLS[:1]),
        message(3, "user", "Next question", turn="t2"),
        message(4, "assistant", "Next answer", turn="t2"),
    ]
    assert [[m.seq for m in t] for t in group_turns(messages)] == [[1, 2], [3, 4]]


def test_the_doorbell_rings_only_for_a_newer_steer() -> None:
    assert not is_newer(None, None) and not is_newer(None, 4)
    assert is_newer(5, None) and is_newer(5, 4)
    assert not is_newer(5, 5) and not is_newer(4, 5)
