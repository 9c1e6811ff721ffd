"""The import bench's own arithmetic (bench/locomo_import.py): how a LoCoMo file becomes an
import the route accepts, and how its questions are counted by category. No stack."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from bench.locomo_import import (
    by_category,
    import_items,
    load_dialogues,
    overall,
    parse_dialogue,
    synthetic_items,
)
from bench.prompt_figures import Question
from parley.imports import ImportItem, check_items

CONVERSATION: dict[str, Any] = {
    "speaker_a": "Ada",
    "speaker_b": "Bo",
    "session_2_date_time": "9:05 am on 3 June, 2023",
    "session_2": [{"speaker": "Bo", "dia_id": "D2:1", "text": "Back again."}],
    "session_1_date_time": "11:59 pm on 2 June, 2023",
    "session_1": [
        {"speaker": "Ada", "dia_id": "D1:1", "text": "Hi!"},
        {"speaker": "Bo", "dia_id": "D1:2", "text": "Look.", "blip_caption": "a red kite"},
    ],
    "session_3_date_time": "1:00 pm on 4 June, 2023",  # a date without turns
}
QA = [{"question": "What flew?", "evidence": ["D1:2"], "category": 1}]


def as_items(items: list[dict[str, Any]]) -> list[ImportItem]:
    return [
        ImportItem(i["role"], i["text"], datetime.fromisoformat(i["created_at"])) for i in items
    ]


@pytest.mark.parametrize(
    "data", [CONVERSATION | {"qa": QA}, {"conversation": CONVERSATION, "qa": QA}]
)
def test_a_conversation_becomes_items_the_route_accepts_in_session_order(
    data: dict[str, Any],
) -> None:
    dialogue = parse_dialogue("07", data)

    items, dia_ids = import_items(dialogue)

    assert dia_ids == ["D1:1", "D1:2", "D2:1"]
    assert [(i["role"], i["text"]) for i in items] == [
        ("user", "Ada: Hi!"),
        ("assistant", "Bo: Look. [photo: a red kite]"),
        ("assistant", "Bo: Back again."),
    ]
    assert [i["created_at"] for i in items] == [
        "2023-06-02T23:59:00+00:00",
        "2023-06-02T23:59:01+00:00",  # a second a turn, past midnight's date as it falls
        "2023-06-03T09:05:00+00:00",
    ]
    check_items(as_items(items), now=datetime.now(UTC), max_chars=8000)


def test_a_session_dated_before_the_last_turn_keeps_times_non_decreasing() -> None:
    early = CONVERSATION | {"session_2_date_time": "11:59 pm on 2 June, 2023"}
    items, _ = import_items(parse_dialogue("07", early | {"qa": QA}))

    assert items[2]["created_at"] == items[1]["created_at"]
    check_items(as_items(items), now=datetime.now(UTC), max_chars=8000)


def test_synthetic_messages_vary_and_are_accepted() -> None:
    items = synthetic_items(300)

    assert len({i["text"] for i in items}) == 300
    assert len({i["text"].split(";")[0] for i in items}) > 50
    check_items(as_items(items), now=datetime.now(UTC), max_chars=8000)


def test_a_missing_folder_or_conversation_is_named(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="--locomo-dir"):
        load_dialogues(tmp_path / "absent", None)
    with pytest.raises(FileNotFoundError, match="99.json"):
        load_dialogues(tmp_path, ["99"])


def question(category: int, evidence: set[int], shown: set[int]) -> Question:
    return Question(category, frozenset(evidence), frozenset(shown), context=100, prompt=900)


def test_questions_count_by_category_and_over_all_conversations() -> None:
    first = [question(1, {3}, {3, 4}), question(2, {5, 6}, {5}), question(2, {7}, {7})]
    second = [question(2, {1}, set())]

    assert by_category(first) == {1: (1, 1), 2: (1, 2)}
    rows = [
        {
            "questions": len(qs),
            "evidence_in_prompt": sum(q.evidence <= q.shown for q in qs) / len(qs),
            "by_category": {str(c): list(v) for c, v in by_category(qs).items()},
            "footprint": 0.1,
            "mean_prompt_tokens": 900.0,
            "worker_cpu_ms_per_question": None,
        }
        for qs in (first, second)
    ]
    figures = overall(rows)
    assert figures["by_category_all"] == {"1": [1, 1], "2": [1, 3]}
    assert figures["min_evidence_in_prompt"] == 0.0
    assert figures["mean_evidence_in_prompt"] == pytest.approx((2 / 3 + 0) / 2)
    assert figures["worker_cpu_ms_per_question"] is None
