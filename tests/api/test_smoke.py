from tests.support.client import ParleyClient, streamed_text


async def test_a_turn_streams_and_stores_the_answer(priya: ParleyClient) -> None:
    session_id = await priya.new_session()
    turn_id, events = await priya.turn(session_id, "Tell me about yourself")
    assert events[-1].type == "done"
    final = events[-1].data["message"]
    assert final["text"] == streamed_text(events)
    assert "orders" in final["text"]
    messages = await priya.messages(session_id)
    assert [(m["seq"], m["role"]) for m in messages] == [(1, "user"), (2, "assistant")]
    assert messages[1]["text"] == final["text"] and messages[1]["status"] == "complete"


async def test_a_tool_turn_stores_the_call_its_result_and_the_answer_in_order(
    priya: ParleyClient,
) -> None:
    session_id = await priya.new_session()
    _, events = await priya.turn(session_id, "Where is my order?")
    assert events[-1].type == "done"
    messages = await priya.messages(session_id)
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant"]
    call = messages[1]["tool_calls"][0]
    assert call["name"] == "list_open_orders" and call["arguments"] == {}
    assert messages[2]["tool_call_id"] == call["id"]
    assert messages[3]["text"] == events[-1].data["message"]["text"]
    assert "8472" in messages[3]["text"]
