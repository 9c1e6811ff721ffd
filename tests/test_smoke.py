from tests.client import ParleyClient, streamed_text


async def test_a_turn_streams_and_stores_the_answer(priya: ParleyClient) -> None:
    session_id = await priya.new_session()
    turn_id, events = await priya.turn(session_id, "Where is my order?")
    assert events[-1].type == "done"
    final = events[-1].data["message"]
    assert final["text"] == streamed_text(events)
    assert "Where is my order?" in final["text"]
    messages = await priya.messages(session_id)
    assert [(m["seq"], m["role"]) for m in messages] == [(1, "user"), (2, "assistant")]
    assert messages[1]["text"] == final["text"] and messages[1]["status"] == "complete"
