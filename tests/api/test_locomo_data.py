"""The LoCoMo bench reads the slimmed file and the upstream ones, and a shared photo's
caption is stored with its message (bench/memory.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench.memory import load_locomo, locomo_one, photo_note
from parley.config import Settings
from parley.store.db import Database


def _upstream_conversation() -> dict[str, object]:
    return {
        "speaker_a": "Mel",
        "speaker_b": "Caroline",
        "session_1_date_time": "1:56 pm on 8 May, 2023",
        "session_1": [
            {"speaker": "Mel", "dia_id": "D1:1", "text": "Hi Caroline!"},
            {
                "speaker": "Caroline",
                "dia_id": "D1:2",
                "text": "Take a look at this.",
                "blip_caption": "a photo of a painting of a sunset over a lake",
                "query": "painting sunrise",
            },
        ],
        "session_2_date_time": "2:00 pm on 9 May, 2023",  # a date with no session
        "qa": [{"question": "What did Caroline paint?", "evidence": ["D1:2"], "category": 4}],
    }


def test_a_photo_turn_carries_its_caption_and_nothing_else_does() -> None:
    turn = _upstream_conversation()["session_1"][1]  # type: ignore[index]
    assert photo_note(turn) == " [photo: a photo of a painting of a sunset over a lake]"
    assert "sunrise" not in photo_note(turn)  # the dataset's search query is not used
    assert photo_note({"speaker": "Mel", "text": "Hi", "blip_caption": " "}) == ""
    assert photo_note({"speaker": "Mel", "text": "Hi"}) == ""


def test_upstream_and_slimmed_files_load_by_conversation_name(tmp_path: Path) -> None:
    upstream = tmp_path / "26.json"
    upstream.write_text(json.dumps(_upstream_conversation()))
    slim = tmp_path / "slim.json"
    slim.write_text(json.dumps({"conv-30": {"speaker_a": "A", "sessions": [], "qa": []}}))
    found = load_locomo([upstream, slim, tmp_path / "missing.json"])
    assert sorted(found) == ["conv-26", "conv-30"]
    conv = found["conv-26"]
    assert [len(s["turns"]) for s in conv["sessions"]] == [2]  # the empty date is no session
    assert conv["sessions"][0]["turns"][1]["blip_caption"].startswith("a photo of a painting")
    assert conv["qa"][0]["evidence"] == ["D1:2"]


def _small_conversation() -> dict[str, Any]:
    """Two dated sessions; the second question's evidence is many turns before it is asked."""
    chatter = [
        ("Mel", "How was your week?"),
        ("Caroline", "Busy, lots of meetings at work."),
        ("Mel", "Same here, the office was hectic."),
        ("Caroline", "Did you get any rest at the weekend?"),
        ("Mel", "A little, I read a book in the garden."),
        ("Caroline", "That sounds nice and calm."),
    ]
    first = [
        {"speaker": "Caroline", "dia_id": "D1:1", "text": "I adopted a greyhound named Biscuit."},
        *(
            {"speaker": who, "dia_id": f"D1:{i}", "text": text}
            for i, (who, text) in enumerate(chatter * 3, start=2)
        ),
    ]
    second = [
        {"speaker": "Mel", "dia_id": f"D2:{i}", "text": text}
        for i, (_, text) in enumerate(chatter, start=1)
    ]
    return {
        "speaker_a": "Mel",
        "speaker_b": "Caroline",
        "sessions": [
            {"date_time": "1:56 pm on 8 May, 2023", "turns": first},
            {"date_time": "2:00 pm on 9 June, 2023", "turns": second},
        ],
        "qa": [
            {
                "question": "What is the name of Caroline's greyhound?",
                "evidence": ["D1:1"],
                "category": 4,
            },
            {"question": "Where did Mel read a book?", "evidence": ["D2:5"], "category": 4},
            {"question": "A question about a photo", "evidence": ["D9:9"], "category": 4},
            {"question": "Adversarial", "evidence": ["D1:1"], "category": 5},
        ],
    }


async def test_the_locomo_section_packs_each_question_with_the_real_builder(
    settings: Settings, sessions: Database
) -> None:
    """Section (e) of `make bench` drives the context builder's own packing; a change to the
    builder that the bench does not follow fails here, not in the next bench run."""
    result = await locomo_one(settings, sessions, "small", _small_conversation(), share=0.3)
    assert result["questions"] == 2  # unknown evidence and category 5 are not asked
    assert result["evidence_recall"] == 1.0, result["missed_by_category"]
    assert 0 < result["footprint"] < 1
