"""Files users upload into their sessions, and the files a message refers to.

Owner-scoped like every read the API answers: another user's file is missing (404), never
forbidden. Nothing here commits (see `store`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import delete, select
from sqlalchemy.ext.asyncio import AsyncSession

from parley.attachments import AttachedFile
from parley.errors import InvalidRequest, NotFound
from parley.file_text import Extracted
from parley.ids import new_id
from parley.store.identity import Identity
from parley.store.models import Message, SessionFile
from parley.store.rows import typed_row
from parley.store.sessions import get_session

FILE_NOT_FOUND = "file not found"


@dataclass(frozen=True)
class FileRow:
    """An upload as its owner sees it: its name, type and size (`bytes` is a type's name),
    and its bytes where it was read to be downloaded."""

    id: str
    name: str
    content_type: str
    size: int
    content: bytes


async def store_file(
    db: AsyncSession,
    *,
    owner: Identity,
    session_id: str,
    name: str,
    content: bytes,
    extracted: Extracted,
) -> FileRow:
    """Keep an upload of the owner's session with its extracted text."""
    await get_session(db, owner=owner, session_id=session_id)
    row = SessionFile(
        id=new_id("file"),
        session_id=session_id,
        tenant_id=owner.tenant_id,
        user_id=owner.user_id,
        name=name,
        content_type=extracted.content_type,
        size=len(content),
        content=content,
        text=extracted.text,
        meta=extracted.meta,
    )
    db.add(row)
    await db.flush()
    return typed_row(FileRow, row)


async def get_file(db: AsyncSession, *, owner: Identity, session_id: str, file_id: str) -> FileRow:
    await get_session(db, owner=owner, session_id=session_id)
    row = await db.scalar(
        select(SessionFile).where(
            SessionFile.id == file_id,
            SessionFile.session_id == session_id,
            SessionFile.tenant_id == owner.tenant_id,
            SessionFile.user_id == owner.user_id,
        )
    )
    if row is None:
        raise NotFound(FILE_NOT_FOUND, file_id=file_id)
    return typed_row(FileRow, row)


async def check_owned(
    db: AsyncSession, *, owner: Identity, session_id: str, file_ids: Sequence[str]
) -> list[str]:
    """The ids, deduplicated in order, once each is a file of this session and user. A message
    naming any other id is an invalid request (422), whoever that file belongs to: the
    message's session exists, its body is what is wrong."""
    wanted = list(dict.fromkeys(file_ids))
    if not wanted:
        return []
    found = set(
        await db.scalars(
            select(SessionFile.id).where(
                SessionFile.id.in_(wanted),
                SessionFile.session_id == session_id,
                SessionFile.tenant_id == owner.tenant_id,
                SessionFile.user_id == owner.user_id,
            )
        )
    )
    for file_id in wanted:
        if file_id not in found:
            raise InvalidRequest(f"file_ids: {FILE_NOT_FOUND} in this session", field="file_ids")
    return wanted


async def message_files(db: AsyncSession, *, message_id: str) -> list[AttachedFile]:
    """The files a stored message refers to, in the order it named them (for its prompt)."""
    message = await db.get(Message, message_id)
    ids = list(message.file_ids or []) if message is not None else []
    if not ids or message is None:
        return []
    rows = {
        row.id: row
        for row in await db.scalars(
            select(SessionFile).where(
                SessionFile.id.in_(ids), SessionFile.session_id == message.session_id
            )
        )
    }
    return [
        AttachedFile(row.id, row.name, row.content_type, row.text, dict(row.meta or {}))
        for row in (rows.get(i) for i in ids)
        if row is not None
    ]


async def delete_session_files(db: AsyncSession, *, session_id: str) -> int:
    """Delete every file of a session (its bytes and text), with the session."""
    result = await db.execute(delete(SessionFile).where(SessionFile.session_id == session_id))
    return int(result.rowcount)  # type: ignore[attr-defined]
