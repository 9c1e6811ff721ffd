"""The LoCoMo bench reads the slimmed file and the upstream ones, and a shared photo's
caption is stored with its message (bench/memory.py)."""

from __future__ import annotations

import json
from pathlib import Path

from bench.memory import load_locomo, photo_note


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
