"""The pure rules of forgetting a message (parley/forgetting.py): how a copy of its text is
scrubbed out of a JSON record, and what its events keep."""

from __future__ import annotations

from parley.forgetting import FORGOTTEN, Scrubber, emptied_event, needles_of


def test_a_needle_is_replaced_everywhere_in_a_record_as_a_whole_word() -> None:
    scrub = Scrubber(["Pri", "my nickname is zed42", "  "])
    record = {
        "messages": [{"role": "user", "content": "Hi, my nickname is zed42. Call me Pri."}],
        "budget": {"blocks": ["Priority: Pri"], "tokens": 12},
    }
    assert scrub.json(record) == {
        "messages": [{"role": "user", "content": f"Hi, {FORGOTTEN}. Call me {FORGOTTEN}."}],
        "budget": {"blocks": [f"Priority: {FORGOTTEN}"], "tokens": 12},
    }
    assert not Scrubber(["", " "]) and Scrubber(["x"])
    assert Scrubber([]).text("unchanged") == "unchanged"
    # A needle that is not a word at its ends matches inside words too; regex text is literal.
    assert Scrubber(["(a+)"]).text("x(a+)y aaa") == f"x{FORGOTTEN}y aaa"


def test_the_events_of_a_forgotten_message_keep_their_shape_without_text() -> None:
    gone = {"msg_a"}
    delta = {"message_id": "msg_a", "text": "secret"}
    assert emptied_event("delta", delta, gone, whole_turn=False) == {
        "message_id": "msg_a",
        "text": "",
    }
    other = {"message_id": "msg_b", "text": "kept"}
    assert emptied_event("delta", other, gone, whole_turn=True) is None
    done = {"message": {"id": "msg_a", "text": "secret", "tool_calls": [{"id": "c"}]}}
    assert emptied_event("done", done, gone, whole_turn=False) == {
        "message": {"id": "msg_a", "text": "", "tool_calls": None}
    }
    assert emptied_event("done", {"message": {"id": "msg_b"}}, gone, whole_turn=True) is None
    asked = {"question": "Which of 8472 or secret?", "options": [{"label": "x", "value": "1"}]}
    assert emptied_event("clarification", asked, gone, whole_turn=False) is None
    assert emptied_event("clarification", asked, gone, whole_turn=True) == {
        "question": "",
        "options": [],
    }
    assert emptied_event("state", {"state": "completed"}, gone, whole_turn=True) is None


def test_a_message_is_looked_for_whole_and_as_the_code_summarizers_quote_it() -> None:
    text = "My nickname is zed42 and " + "word " * 30 + "end. Second sentence here."
    forms = needles_of(text)
    assert text in forms
    assert any(f.startswith("My nickname is zed42") and len(f.split()) == 20 for f in forms)
    assert needles_of("  ") == set() and needles_of("Hi.") == {"Hi."}
