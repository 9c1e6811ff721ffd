"""Exports of a user's own data: the request, its progress, its archive, and the reads that fill
it (every session with its messages, files, pinned facts, actions and feedback; consented
memory). The archive's format is parley/archive.py's.

Owner-scoped like every read the API answers: another user's export is missing (404). An
export past `expires_at` answers `ExportExpired` (410) whatever its state, until the retention
purge deletes the row. Nothing here commits (see `store`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar, Protocol, TypeVar

from psycopg.types.json import Jsonb

from parley.archive import ArchivedFile, ArchivedSession
from parley.errors import ExportExpired, ExportNotReady, NotFound
from parley.ids import new_id
from parley.statuses import ExportState
from parley.store.db import Db

EXPORT_NOT_FOUND = "export not found"
# An export asked for again this soon after a finished one answers that one.
REASK_WINDOW = timedelta(minutes=1)


@dataclass(frozen=True)
class ExportRow:
    """An export as its owner sees it (never the archive's bytes)."""

    id: str
    tenant_id: str
    user_id: str
    state: str
    sessions_total: int
    sessions_done: int
    counts: dict[str, Any]
    size: int | None
    created_at: datetime
    expires_at: datetime
    finished_at: datetime | None

    COLUMNS: ClassVar[str] = (
        "id, tenant_id, user_id, state, sessions_total, sessions_done, counts,"
        ' "bytes" AS size, created_at, expires_at, finished_at'
    )


async def request_export(
    db: Db, *, tenant_id: str, user_id: str, ttl: timedelta
) -> tuple[ExportRow, bool]:
    """A new export of the user's data, valid for `ttl` from now; or the one of theirs still
    being written, or written within `REASK_WINDOW` (so asking twice, or a double click,
    writes one archive). Returns it and whether it is new."""
    owner = {"tenant_id": tenant_id, "user_id": user_id}
    running = await db.row(_RUNNING, {**owner, "reask": REASK_WINDOW}, ExportRow)
    if running is not None:
        return running, False
    now = datetime.now(UTC)
    params = {**owner, "id": new_id("exp"), "created_at": now, "expires_at": now + ttl}
    export = await db.row(_REQUEST, params, ExportRow)
    assert export is not None
    return export, True


_RUNNING = f"""
    SELECT {ExportRow.COLUMNS} FROM exports
    WHERE tenant_id = %(tenant_id)s AND user_id = %(user_id)s AND expires_at > now()
        AND (state IN ('{ExportState.pending}', '{ExportState.running}')
             OR (state = '{ExportState.ready}' AND created_at > now() - %(reask)s))
    ORDER BY created_at DESC
    LIMIT 1
"""
_REQUEST = f"""
    INSERT INTO exports (id, tenant_id, user_id, state, sessions_total, sessions_done, counts,
                         created_at, expires_at)
    VALUES (%(id)s, %(tenant_id)s, %(user_id)s, '{ExportState.pending}', 0, 0, '{{}}',
            %(created_at)s, %(expires_at)s)
    RETURNING {ExportRow.COLUMNS}
"""


class _Expiring(Protocol):
    @property
    def expires_at(self) -> datetime: ...


Owned = TypeVar("Owned", bound=_Expiring)


async def _owned(
    db: Db, sql: str, row: type[Owned], *, tenant_id: str, user_id: str, export_id: str
) -> Owned:
    params = {"id": export_id, "tenant_id": tenant_id, "user_id": user_id}
    export = await db.row(sql, params, row)
    if export is None:
        raise NotFound(EXPORT_NOT_FOUND)
    if export.expires_at <= datetime.now(UTC):
        raise ExportExpired("the export's link has expired; ask for a new export")
    return export


_OWNED = "WHERE id = %(id)s AND tenant_id = %(tenant_id)s AND user_id = %(user_id)s"
_OWNED_EXPORT = f"SELECT {ExportRow.COLUMNS} FROM exports {_OWNED}"


@dataclass(frozen=True)
class _Archive:
    state: str
    archive: bytes | None
    expires_at: datetime


_OWNED_ARCHIVE = f"SELECT state, archive, expires_at FROM exports {_OWNED}"


async def get_export(db: Db, *, tenant_id: str, user_id: str, export_id: str) -> ExportRow:
    """The owner's export and its progress (404 for anyone else, 410 once expired)."""
    owner = {"tenant_id": tenant_id, "user_id": user_id, "export_id": export_id}
    return await _owned(db, _OWNED_EXPORT, ExportRow, **owner)


async def get_archive(db: Db, *, tenant_id: str, user_id: str, export_id: str) -> bytes:
    """The owner's finished archive (409 while it is written, 410 once expired)."""
    owner = {"tenant_id": tenant_id, "user_id": user_id, "export_id": export_id}
    export = await _owned(db, _OWNED_ARCHIVE, _Archive, **owner)
    if export.state != ExportState.ready or export.archive is None:
        raise ExportNotReady("the archive is not written yet", state=export.state)
    return export.archive


async def read_export(db: Db, *, export_id: str) -> ExportRow:
    """An export by id, whoever owns it (the workflow's activities and the operator CLI)."""
    export = await db.row(_READ, {"id": export_id}, ExportRow)
    if export is None:
        raise NotFound(EXPORT_NOT_FOUND)
    return export


_READ = f"SELECT {ExportRow.COLUMNS} FROM exports WHERE id = %(id)s"


async def read_archive(db: Db, *, export_id: str) -> bytes | None:
    """An export's archive by id (the operator CLI), None until it is ready."""
    archive = await db.value("SELECT archive FROM exports WHERE id = %(id)s", {"id": export_id})
    return bytes(archive) if archive is not None else None


async def start_writing(db: Db, *, export_id: str, sessions_total: int) -> None:
    await db.run(_START, {"id": export_id, "total": sessions_total})


_START = f"""
    UPDATE exports SET state = '{ExportState.running}', sessions_total = %(total)s,
        sessions_done = 0
    WHERE id = %(id)s
"""


async def record_progress(db: Db, *, export_id: str, sessions_done: int) -> None:
    await db.run(_PROGRESS, {"id": export_id, "done": sessions_done})


_PROGRESS = "UPDATE exports SET sessions_done = %(done)s WHERE id = %(id)s"


async def finish_export(db: Db, *, export_id: str, archive: bytes, counts: dict[str, int]) -> None:
    params = {"id": export_id, "archive": archive, "size": len(archive), "counts": Jsonb(counts)}
    await db.run(_FINISH, params)


_FINISH = f"""
    UPDATE exports SET state = '{ExportState.ready}', archive = %(archive)s, "bytes" = %(size)s,
        counts = %(counts)s, finished_at = now()
    WHERE id = %(id)s
"""


async def fail_export(db: Db, *, export_id: str) -> None:
    await db.run(_FAIL, {"id": export_id})


_FAIL = f"UPDATE exports SET state = '{ExportState.failed}', finished_at = now() WHERE id = %(id)s"


# The reads that fill an archive.


def _iso(moment: datetime | None) -> str | None:
    return moment.isoformat() if moment is not None else None


@dataclass(frozen=True)
class _Id:
    id: str


async def user_session_ids(db: Db, *, tenant_id: str, user_id: str) -> list[str]:
    """Every session of the user, deleted ones too (their rows are still held), oldest first."""
    rows = await db.rows(_USER_SESSIONS, {"tenant_id": tenant_id, "user_id": user_id}, _Id)
    return [row.id for row in rows]


_USER_SESSIONS = """
    SELECT id FROM sessions WHERE tenant_id = %(tenant_id)s AND user_id = %(user_id)s
    ORDER BY created_at, id
"""


@dataclass(frozen=True)
class _Session:
    id: str
    created_at: datetime
    deleted_at: datetime | None


async def session_content(db: Db, *, session_id: str) -> ArchivedSession:
    """One session as the archive shows it."""
    where = {"session_id": session_id}
    session = await db.row(_SESSION, where, _Session)
    if session is None:
        raise NotFound("session not found", session_id=session_id)
    messages = await _archived(db, _MESSAGES, where)
    return ArchivedSession(
        id=session.id,
        created_at=session.created_at.isoformat(),
        deleted_at=_iso(session.deleted_at),
        messages=[row | {"file_ids": list(row["file_ids"] or [])} for row in messages],
        pinned_facts=await _archived(db, _PINNED_FACTS, where),
        actions=await _archived(db, _ACTIONS, where),
        feedback=await _archived(db, _FEEDBACK, where),
        files=[
            ArchivedFile(f.id, f.name, f.content_type, bytes(f.content), f.created_at.isoformat())
            for f in await db.rows(_FILES, where, _File)
        ],
    )


_SESSION = "SELECT id, created_at, deleted_at FROM sessions WHERE id = %(session_id)s"


# A session's rows of one table as the archive holds them (see `_archived`). Messages of
# every version of the conversation: each with its branch, and whether the version shown
# leaves it out (store/branches/__init__.py).
_MESSAGES = """
    SELECT id, seq, role, status, text, created_at, file_ids, replaced_by, branch, off_path
    FROM messages WHERE session_id = %(session_id)s ORDER BY seq
"""
_PINNED_FACTS = """
    SELECT key, value, source_seq, updated_at
    FROM pinned_facts WHERE session_id = %(session_id)s ORDER BY key
"""
_ACTIONS = """
    SELECT id, tool, summary, recipient_masked AS recipient, status, decline_reason,
        created_at, expires_at, resolved_at, renewed_from
    FROM actions WHERE session_id = %(session_id)s ORDER BY created_at
"""
_FEEDBACK = """
    SELECT message_id, rating, comment, created_at, updated_at
    FROM feedback WHERE session_id = %(session_id)s ORDER BY created_at
"""


async def _archived(conn: Db, sql: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    """Each row as the archive holds it: a JSON object of the selected columns, under their
    names and in their order (the statement is the archive's format), a time in ISO 8601."""
    rows = await conn.rows(sql, params, dict)
    return [{k: _iso(v) if isinstance(v, datetime) else v for k, v in r.items()} for r in rows]


@dataclass(frozen=True)
class _File:
    id: str
    name: str
    content_type: str
    content: bytes
    created_at: datetime


_FILES = """
    SELECT id, name, content_type, content, created_at
    FROM files WHERE session_id = %(session_id)s ORDER BY created_at, id
"""


@dataclass(frozen=True)
class _MemoryItem:
    key: str
    value: str
    source: str
    created_at: datetime
    expires_at: datetime | None
    # Where the message that wrote it is (None: an action wrote it, or the message is gone).
    message_session_id: str | None
    message_seq: int | None


async def memory_content(
    db: Db, *, tenant_id: str, user_id: str
) -> tuple[bool, list[dict[str, Any]]]:
    """The user's consent and every remembered item held for them, each with its source (the
    message or action that wrote it, and for a message where it is)."""
    owner = {"tenant_id": tenant_id, "user_id": user_id}
    consent = await db.value(_CONSENT, owner)
    items = [
        {
            "key": item.key,
            "value": item.value,
            "source": item.source,
            "source_message": (
                {"session_id": item.message_session_id, "seq": item.message_seq}
                if item.message_session_id is not None
                else None
            ),
            "created_at": _iso(item.created_at),
            "expires_at": _iso(item.expires_at),
        }
        for item in await db.rows(_MEMORY, owner, _MemoryItem)
    ]
    return bool(consent), items


_CONSENT = """
    SELECT consent FROM memory_consents WHERE tenant_id = %(tenant_id)s AND user_id = %(user_id)s
"""
# A memory item's source is "message:<id>" or "action:<id>".
_MEMORY = """
    SELECT um.key, um.value, um.source, um.created_at, um.expires_at,
        m.session_id AS message_session_id, m.seq AS message_seq
    FROM user_memory um
    LEFT JOIN messages m ON left(um.source, 8) = 'message:' AND m.id = substr(um.source, 9)
    WHERE um.tenant_id = %(tenant_id)s AND um.user_id = %(user_id)s
    ORDER BY um.key
"""


async def user_exists(db: Db, *, tenant_id: str, user_id: str) -> bool:
    """Whether the user is known (the operator CLI refuses to export nobody)."""
    found = await db.value(_USER, {"tenant_id": tenant_id, "user_id": user_id})
    return found is not None


_USER = "SELECT 1 FROM users WHERE tenant_id = %(tenant_id)s AND id = %(user_id)s"
