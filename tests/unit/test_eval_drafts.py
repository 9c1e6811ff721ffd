"""The captured eval drafts an erasure looks for (store/lifecycle/eval_drafts.py): a user's, or one
session's, set aside emptied so a retried step counts the same number."""

from __future__ import annotations

from pathlib import Path

import yaml

from parley.erasure import ErasureScope
from parley.store.lifecycle import eval_drafts
from parley.store.lifecycle.erasure_catalogue import Subject


def draft(folder: Path, message: str, *, user: str, session: str, tenant: str = "t") -> Path:
    path = folder / f"feedback-{message}.yaml"
    body = {
        "tenant": tenant,
        "user": user,
        "status": "draft",
        "source": {"feedback_message_id": message, "session_id": session, "turn_id": ""},
        "steps": [{"say": f"words of {user}", "expect": {}}],
    }
    path.write_text("# DRAFT\n" + yaml.safe_dump(body))
    return path


def test_a_user_takes_every_draft_of_theirs_a_session_only_its_own(tmp_path: Path) -> None:
    a1 = draft(tmp_path, "m1", user="u", session="s1")
    a2 = draft(tmp_path, "m2", user="u", session="s2")
    other = draft(tmp_path, "m3", user="v", session="s1")
    elsewhere = draft(tmp_path, "m4", user="u", session="s1", tenant="t2")
    (tmp_path / "notes.yaml").write_text("not: a draft\n")
    user = Subject(ErasureScope.user, "t", "u")
    session = Subject(ErasureScope.session, "t", "u", "s1")
    assert eval_drafts.drafts_of(tmp_path, user) == [a1, a2]
    assert eval_drafts.drafts_of(tmp_path, session) == [a1]
    assert other.exists() and elsewhere.exists()
    assert eval_drafts.drafts_of(tmp_path / "missing", user) == []


def test_set_aside_empties_the_drafts_and_a_retry_counts_the_same(tmp_path: Path) -> None:
    mine = [draft(tmp_path, f"m{n}", user="u", session="s") for n in range(3)]
    kept = draft(tmp_path, "m9", user="v", session="s")
    user = Subject(ErasureScope.user, "t", "u")
    assert eval_drafts.set_aside(tmp_path, erasure_id="era_1", subject=user) == 3
    aside = eval_drafts.set_aside_files(tmp_path, erasure_id="era_1")
    assert len(aside) == 3 and all(p.read_bytes() == b"" for p in aside)
    assert not any(p.exists() for p in mine) and kept.exists()
    # A retry (or a later pass after a draft raced the erasure) moves only what is new.
    assert eval_drafts.set_aside(tmp_path, erasure_id="era_1", subject=user) == 0
    draft(tmp_path, "m5", user="u", session="s")
    assert eval_drafts.set_aside(tmp_path, erasure_id="era_1", subject=user) == 1
    assert len(eval_drafts.set_aside_files(tmp_path, erasure_id="era_1")) == 4
    eval_drafts.close(tmp_path, erasure_id="era_1")
    eval_drafts.close(tmp_path, erasure_id="era_1")
    assert eval_drafts.set_aside_files(tmp_path, erasure_id="era_1") == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["feedback-m9.yaml"]
