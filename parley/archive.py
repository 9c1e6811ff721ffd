"""The archive a user's export is written as: one zip, a JSON manifest plus a folder per session.

Layout (format `parley-export/1`):

    manifest.json                 who, when, counts by kind, the sessions and their folders
    memory.json                   consent and the consented memory items, each with its source
    sessions/<sid>/session.json   the session, its messages (text, status, times), pinned facts,
                                  the actions proposed to the user with what they decided,
                                  their feedback, and the files' descriptions
    sessions/<sid>/files/<fid>-<name>   each uploaded or produced file's bytes, as stored

Pure: built in memory from plain values the export activity reads from the store, so the
format is tested without a database. Counts are taken from what was written, so the
manifest cannot claim what the archive does not hold.
"""

from __future__ import annotations

import io
import json
import re
import zipfile
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

FORMAT = "parley-export/1"
MANIFEST = "manifest.json"
MEMORY = "memory.json"
# The kinds the manifest counts; the export round-trip test compares each with the database.
KINDS = ("sessions", "messages", "files", "memory_items", "pinned_facts", "feedback", "actions")


@dataclass(frozen=True)
class ArchivedFile:
    id: str
    name: str
    content_type: str
    content: bytes
    created_at: str


@dataclass(frozen=True)
class ArchivedSession:
    """One session's content as the archive shows it (JSON-ready values, times as ISO text)."""

    id: str
    created_at: str
    deleted_at: str | None
    messages: list[dict[str, Any]]
    pinned_facts: list[dict[str, Any]]
    actions: list[dict[str, Any]]
    feedback: list[dict[str, Any]]
    files: list[ArchivedFile] = field(default_factory=list)


def _safe_name(name: str) -> str:
    """A file name that stays inside its folder of the archive."""
    cleaned = re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._") or "file"
    return cleaned[-100:]


class ArchiveWriter:
    """Writes sessions one at a time into a zip held in memory; `finish` adds the manifest."""

    def __init__(self, *, export_id: str, tenant_id: str, user_id: str, created_at: str) -> None:
        self._buffer = io.BytesIO()
        self._zip = zipfile.ZipFile(self._buffer, "w", compression=zipfile.ZIP_DEFLATED)
        self._header = {
            "format": FORMAT,
            "export_id": export_id,
            "tenant_id": tenant_id,
            "user_id": user_id,
            "created_at": created_at,
        }
        self.counts: Counter[str] = Counter(dict.fromkeys(KINDS, 0))
        self._sessions: list[dict[str, str]] = []

    def _json(self, path: str, value: Any) -> None:
        self._zip.writestr(path, json.dumps(value, ensure_ascii=False, indent=1, default=str))

    def add_session(self, session: ArchivedSession) -> None:
        folder = f"sessions/{session.id}"
        files = []
        for each in session.files:
            path = f"{folder}/files/{each.id}-{_safe_name(each.name)}"
            self._zip.writestr(path, each.content)
            files.append(
                {
                    "id": each.id,
                    "name": each.name,
                    "content_type": each.content_type,
                    "bytes": len(each.content),
                    "created_at": each.created_at,
                    "path": path,
                }
            )
        self._json(
            f"{folder}/session.json",
            {
                "id": session.id,
                "created_at": session.created_at,
                "deleted_at": session.deleted_at,
                "messages": session.messages,
                "pinned_facts": session.pinned_facts,
                "actions": session.actions,
                "feedback": session.feedback,
                "files": files,
            },
        )
        self._sessions.append({"id": session.id, "path": f"{folder}/session.json"})
        self.counts.update(
            sessions=1,
            messages=len(session.messages),
            files=len(files),
            pinned_facts=len(session.pinned_facts),
            actions=len(session.actions),
            feedback=len(session.feedback),
        )

    def add_memory(self, *, consent: bool, items: list[dict[str, Any]]) -> None:
        self._json(MEMORY, {"consent": consent, "items": items})
        self.counts.update(memory_items=len(items))

    def finish(self) -> bytes:
        self._json(
            MANIFEST,
            {**self._header, "counts": dict(self.counts), "sessions": self._sessions},
        )
        self._zip.close()
        return self._buffer.getvalue()


def read_manifest(archive: bytes) -> dict[str, Any]:
    """The manifest of an archive this module wrote (for the CLI's summary line and tests)."""
    with zipfile.ZipFile(io.BytesIO(archive)) as opened:
        return dict(json.loads(opened.read(MANIFEST)))
