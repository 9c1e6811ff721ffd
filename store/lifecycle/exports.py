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
from typing import Any

from sqlalchemy import Executable, and_, func, or_, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from parley.archive import ArchivedFile, ArchivedSession
from parley.errors import ExportExpired, ExportNotReady, NotFound
from parley.ids import new_id
from parley.statuses import ExportState
from parley.store.models import (
    Action,
    ChatSession,
    Export,
    Feedback,
    MemoryConsent,
    Message,
    PinnedFactRow,
    SessionFile,
    User,
    UserMemoryItem,
)
from parley.store.rows import typed_row

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


def _row(export: Export) -> ExportRow:
    return typed_row(ExportRow, export, counts=dict(export.counts or {}))


async def request_export(
    db: AsyncSession, *, tenant_id: str, user_id: str, ttl: timedelta
) -> tuple[ExportRow, bool]:
    """A new export of the user's data, valid for `ttl` from now; or the one of theirs still
    being written, or written within `REASK_WINDOW` (so asking twice, or a double click,
    writes one archive). Returns it and whether it is new."""
    running = await db.scalar(
        select(Export)
        .where(
            Export.tenant_id == tenant_id,
            Export.user_id == user_id,
            Export.expires_at > func.now(),
            or_(
                Export.state.in_([ExportState.pending, ExportState.running]),
                and_(
                    Export.state == ExportState.ready,
                    Export.created_at > func.now() - REASK_WINDOW,
                ),
            ),
        )
        .order_by(Export.created_at.desc())
        .limit(1)
    )
    if running is not None:
        return _row(running), False
    now = datetime.now(UTC)
    export = Export(
        id=new_id("exp"),
        tenant_id=tenant_id,
        user_id=user_id,
        state=ExportState.pending,
        counts={},
        created_at=now,
        expires_at=now + ttl,
    )
    db.add(export)
    await db.flush()
    return _row(export), True


async def _owned(db: AsyncSession, *, tenant_id: str, user_id: str, export_id: str) -> Export:
    export = await db.scalar(
        select(Export).where(
            Export.id == export_id, Export.tenant_id == tenant_id, Export.user_id == user_id
        )
    )
    if export is None:
        raise NotFound(EXPORT_NOT_FOUND)
    if export.expires_at <= datetime.now(UTC):
        raise ExportExpired("the export's link has expired; ask for a new export")
    return export


async def get_export(
    db: AsyncSession, *, tenant_id: str, user_id: str, export_id: str
) -> ExportRow:
    """The owner's export and its progress (404 for anyone else, 410 once expired)."""
    return _row(await _owned(db, tenant_id=tenant_id, user_id=user_id, export_id=export_id))


async def get_archive(db: AsyncSession, *, tenant_id: str, user_id: str, export_id: str) -> bytes:
    """The owner's finished archive (409 while it is written, 410 once expired)."""
    export = await _owned(db, tenant_id=tenant_id, user_id=user_id, export_id=export_id)
    if export.state != ExportState.ready or export.archive is None:
        raise ExportNotReady("the archive is not written yet", state=export.state)
    return export.archive


async def read_export(db: AsyncSession, *, export_id: str) -> ExportRow:
    """An export by id, whoever owns it (the workflow's activities and the operator CLI)."""
    export = await db.get(Export, export_id)
    if export is None:
        raise NotFound(EXPORT_NOT_FOUND)
    return _row(export)


async def read_archive(db: AsyncSession, *, export_id: str) -> bytes | None:
    """An export's archive by id (the operator CLI), None until it is ready."""
    return await db.scalar(select(Export.archive).where(Export.id == export_id))


async def start_writing(db: AsyncSession, *, export_id: str, sessions_total: int) -> None:
    await db.execute(
        update(Export)
        .where(Export.id == export_id)
        .values(state=ExportState.running, sessions_total=sessions_total, sessions_done=0)
    )


async def record_progress(db: AsyncSession, *, export_id: str, sessions_done: int) -> None:
    await db.execute(
        update(Export).where(Export.id == export_id).values(sessions_done=sessions_done)
    )


async def finish_export(
    db: AsyncSession, *, export_id: str, archive: bytes, counts: dict[str, int]
) -> None:
    await db.execute(
        update(Export)
        .where(Export.id == export_id)
        .values(
            state=ExportState.ready,
            archive=archive,
            size=len(archive),
            counts=counts,
            finished_at=func.now(),
        )
    )


async def fail_export(db: AsyncSession, *, export_id: str) -> None:
    await db.execute(
        update(Export)
        .where(Export.id == export_id)
        .values(state=ExportState.failed, finished_at=func.now())
    )


# The reads that fill an archive.


def _iso(moment: datetime | None) -> str | None:
    return moment.isoformat() if moment is not None else None


async def user_session_ids(db: AsyncSession, *, tenant_id: str, user_id: str) -> list[str]:
    """Every session of the user, deleted ones too (their rows are still held), oldest first."""
    rows = await db.scalars(
        select(ChatSession.id)
        .where(ChatSession.tenant_id == tenant_id, ChatSession.user_id == user_id)
        .order_by(ChatSession.created_at, ChatSession.id)
    )
    return list(rows)


async def session_content(db: AsyncSession, *, session_id: str) -> ArchivedSession:
    """One session as the archive shows it."""
    session = await db.get(ChatSession, session_id)
    if session is None:
        raise NotFound("session not found", session_id=session_id)
    return ArchivedSession(
        id=session.id,
        created_at=session.created_at.isoformat(),
        deleted_at=_iso(session.deleted_at),
        messages=await _messages(db, session_id),
        pinned_facts=await _pinned_facts(db, session_id),
        actions=await _actions(db, session_id),
        feedback=await _feedback(db, session_id),
        files=await _files(db, session_id),
    )


async def _messages(db: AsyncSession, session_id: str) -> list[dict[str, Any]]:
    m = Message
    columns = (m.id, m.seq, m.role, m.status, m.text, m.created_at, m.file_ids, m.replaced_by)
    rows = await _archived(db, select(*columns).where(m.session_id == session_id).order_by(m.seq))
    return [row | {"file_ids": list(row["file_ids"] or [])} for row in rows]


async def _pinned_facts(db: AsyncSession, session_id: str) -> list[dict[str, Any]]:
    f = PinnedFactRow
    columns = (f.key, f.value, f.source_seq, f.updated_at)
    return await _archived(db, select(*columns).where(f.session_id == session_id).order_by(f.key))


async def _actions(db: AsyncSession, session_id: str) -> list[dict[str, Any]]:
    a = Action
    recipient = a.recipient_masked.label("recipient")
    columns = (a.id, a.tool, a.summary, recipient, a.status, a.decline_reason)
    query = select(*columns, a.created_at, a.resolved_at).where(a.session_id == session_id)
    return await _archived(db, query.order_by(a.created_at))


async def _feedback(db: AsyncSession, session_id: str) -> list[dict[str, Any]]:
    f = Feedback
    columns = (f.message_id, f.rating, f.comment, f.created_at, f.updated_at)
    query = select(*columns).where(f.session_id == session_id).order_by(f.created_at)
    return await _archived(db, query)


async def _archived(db: AsyncSession, query: Executable) -> list[dict[str, Any]]:
    """A session's rows of one table as the archive holds them: each selected column under
    its name, a time in ISO 8601."""
    rows = (await db.execute(query)).mappings()
    return [
        {key: _iso(v) if isinstance(v, datetime) else v for key, v in row.items()} for row in rows
    ]


async def _files(db: AsyncSession, session_id: str) -> list[ArchivedFile]:
    rows = await db.scalars(
        select(SessionFile)
        .where(SessionFile.session_id == session_id)
        .order_by(SessionFile.created_at, SessionFile.id)
    )
    return [
        ArchivedFile(f.id, f.name, f.content_type, f.content, f.created_at.isoformat())
        for f in rows
    ]


async def memory_content(
    db: AsyncSession, *, tenant_id: str, user_id: str
) -> tuple[bool, list[dict[str, Any]]]:
    """The user's consent and every remembered item held for them, each with its source (the
    message or action that wrote it, and for a message where it is)."""
    consent = await db.scalar(
        select(MemoryConsent.consent).where(
            MemoryConsent.tenant_id == tenant_id, MemoryConsent.user_id == user_id
        )
    )
    rows = await db.scalars(
        select(UserMemoryItem)
        .where(UserMemoryItem.tenant_id == tenant_id, UserMemoryItem.user_id == user_id)
        .order_by(UserMemoryItem.key)
    )
    items = []
    for item in rows:
        kind, _, ref = item.source.partition(":")
        where = None
        if kind == "message":
            found = (
                await db.execute(select(Message.session_id, Message.seq).where(Message.id == ref))
            ).first()
            where = {"session_id": found[0], "seq": found[1]} if found else None
        items.append(
            {
                "key": item.key,
                "value": item.value,
                "source": item.source,
                "source_message": where,
                "created_at": _iso(item.created_at),
                "expires_at": _iso(item.expires_at),
            }
        )
    return bool(consent), items


async def user_exists(db: AsyncSession, *, tenant_id: str, user_id: str) -> bool:
    """Whether the user is known (the operator CLI refuses to export nobody)."""
    found = await db.scalar(select(User.id).where(User.tenant_id == tenant_id, User.id == user_id))
    return found is not None
