"""The draft conversations `parley eval capture --feedback` wrote (`PARLEY_EVAL_CAPTURE_DIR`):
files, not rows, yet copies of user text, so erasing a user or a session (and forgetting a
message) removes the drafts whose `tenant`, `user` and `source` name the subject.

An erasure removes its drafts in two moves so its receipt counts each once, retries
included. First each draft is renamed into the erasure's own folder (`.erasing-<erasure id>`,
an atomic rename) and emptied there: the text is gone at once, an empty file named after the
rated message stays. The receipt's `eval_drafts` count is then *set* to the number of files in
that folder, which only grows while the erasure runs, so a retried step recounts the same
number. Closing the erasure removes the folder.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from parley.erasure import ErasureScope
from parley.store.lifecycle.erasure_catalogue import Subject

# The receipt's key for the drafts it removed (a count of files, not of rows).
EVAL_DRAFTS = "eval_drafts"
_DRAFTS = "feedback-*.yaml"
_ERASING = ".erasing-"


@dataclass(frozen=True)
class DraftSource:
    """Whose text a draft holds, as its YAML says."""

    tenant: str
    user: str
    session_id: str
    message_id: str


def read_source(path: Path) -> DraftSource | None:
    """A draft's source; None for a file that is gone or is not a draft."""
    try:
        data: Any = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("source"), dict):
        return None
    source = data["source"]
    return DraftSource(
        tenant=str(data.get("tenant") or ""),
        user=str(data.get("user") or ""),
        session_id=str(source.get("session_id") or ""),
        message_id=str(source.get("feedback_message_id") or ""),
    )


def _drafts(folder: Path) -> list[tuple[Path, DraftSource]]:
    if not folder.is_dir():
        return []
    found = ((path, read_source(path)) for path in sorted(folder.glob(_DRAFTS)))
    return [(path, source) for path, source in found if source is not None]


def drafts_of(folder: Path, subject: Subject) -> list[Path]:
    """The drafts holding the subject's text: the user's, or one of their sessions'."""
    return [
        path
        for path, source in _drafts(folder)
        if source.tenant == subject.tenant_id
        and source.user == subject.user_id
        and (subject.scope is ErasureScope.user or source.session_id == subject.session_id)
    ]


def drafts_of_session(folder: Path, *, tenant_id: str, user_id: str, session_id: str) -> list[Path]:
    """The drafts captured in one session (each copies what the user said in it)."""
    subject = Subject(ErasureScope.session, tenant_id, user_id, session_id)
    return drafts_of(folder, subject)


def _erasing(folder: Path, erasure_id: str) -> Path:
    return folder / f"{_ERASING}{erasure_id}"


def set_aside(folder: Path, *, erasure_id: str, subject: Subject) -> int:
    """Move the subject's drafts into the erasure's folder, emptied; how many moved now.
    Idempotent: a retry moves what is still in place and empties what it finds there."""
    found = drafts_of(folder, subject)
    erasing = _erasing(folder, erasure_id)
    if found:
        erasing.mkdir(exist_ok=True)
    moved = 0
    for path in found:
        try:
            path.rename(erasing / path.name)
        except FileNotFoundError:  # removed meanwhile
            continue
        moved += 1
    for path in set_aside_files(folder, erasure_id=erasure_id):
        path.write_bytes(b"")
    return moved


def set_aside_files(folder: Path, *, erasure_id: str) -> list[Path]:
    erasing = _erasing(folder, erasure_id)
    return sorted(erasing.iterdir()) if erasing.is_dir() else []


def close(folder: Path, *, erasure_id: str) -> None:
    """The erasure is counted: its folder of emptied drafts goes."""
    shutil.rmtree(_erasing(folder, erasure_id), ignore_errors=True)


def remove(paths: list[Path]) -> int:
    """Delete these drafts (a forgotten message's); how many were still there."""
    removed = 0
    for path in paths:
        try:
            path.unlink()
        except FileNotFoundError:
            continue
        removed += 1
    return removed
