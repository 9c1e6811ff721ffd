"""The offline LoCoMo replay (bench/locomo_lab.py) ranks and counts as the bench does."""

from __future__ import annotations

from bench.locomo_lab import Conversation, evaluate, full_text, nearest, render


def _conversation(recall_budget: int = 400) -> Conversation:
    texts = [
        ("Mel: I adopted a dog named Oscar", ["mel", "adopt", "dog", "name", "oscar"], [1, 0]),
        ("Caroline: Oscar is lovely", ["carolin", "oscar", "love"], [0.9, 0.1]),
        ("Mel: we went camping at the lake", ["mel", "went", "camp", "lake"], [0, 1]),
        ("Caroline: the lake sounds fun", ["carolin", "lake", "sound", "fun"], [0.1, 0.9]),
        ("Mel: bye", ["mel", "bye"], [0.5, 0.5]),
    ]
    messages = [
        {
            "seq": i,
            "role": "user" if text.startswith("Mel") else "assistant",
            "text": text,
            "date": f"2023-05-0{i}",
            "lexemes": lexemes,
            "vector": vector,
            "session": i // 3,
        }
        for i, (text, lexemes, vector) in enumerate(texts, start=1)
    ]
    questions = [
        {  # single-hop: the dog's name
            "question": "What is the name of Mel's dog?",
            "category": 4,
            "evidence": [1],
            "lexemes": [["name"], ["mel"], ["dog"]],
            "vector": [1, 0],
            "window_from": 5,
            "found": True,
        },
        {  # multi-hop: the dog and the lake
            "question": "Where did Mel camp, and with which dog?",
            "category": 1,
            "evidence": [1, 3],
            "lexemes": [["mel"], ["camp"], ["dog"]],
            "vector": [0.7, 0.7],
            "window_from": 5,
            "found": False,
        },
    ]
    return Conversation("tiny", 200, recall_budget, messages, questions)


def test_full_text_ranks_rare_terms_first_and_only_before_the_window() -> None:
    conv = _conversation()
    # "oscar" is in two messages, "adopt" in one: the message with both leads.
    assert full_text(conv, [["oscar"], ["adopt"]], before=6) == [1, 2]
    # Messages from the window on are not candidates.
    assert full_text(conv, [["oscar"], ["adopt"]], before=2) == [1]
    assert full_text(conv, [["lake"]], before=3) == []


def test_nearest_orders_by_cosine() -> None:
    conv = _conversation()
    assert nearest(conv, [0.0, 1.0], before=6)[:2] == [3, 4]
    # Messages from the window on are not candidates; on a tie the newer message comes first.
    assert nearest(conv, [0.0, 1.0], before=4) == [3, 2, 1]
    assert nearest(conv, [1.0, 1.0], before=6)[:3] == [5, 4, 2]


def test_eval_over_several_dumps_reports_each_conversation_and_their_mean() -> None:
    roomy = evaluate([_conversation(recall_budget=400)])["tiny"]
    tight = evaluate([_conversation(recall_budget=400)], budget_scale=0.09)["tiny"]
    line = render({"a": roomy, "b": tight}, "production")
    assert "a 100.0%" in line and "b   0.0%" in line and line.endswith("mean  50.0%")


def test_evaluate_counts_a_question_only_when_all_its_evidence_is_shown() -> None:
    roomy = evaluate([_conversation(recall_budget=400)])["tiny"]
    assert roomy["recall"] == 1.0 and roomy["missed_by_category"] == {}
    # A budget with room for the header and about one line: the multi-hop question, which
    # needs two lines, is missed.
    tight = evaluate([_conversation(recall_budget=400)], budget_scale=0.09)["tiny"]
    assert tight["missed_by_category"].get(1) == 1
    assert tight["real"] == 0.5
