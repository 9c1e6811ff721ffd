"""Files users upload into their sessions, and the files a message refers to.

Owner-scoped like every read the API answers: another user's file is missing (404), never
forbidden. Nothing here commits (see `store`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from psycopg.types.json import Jsonb

from parley.attachments import AttachedFile
from parley.errors import InvalidRequest, NotFound
from parley.file_text import Extracted
from parley.ids import new_id
from parley.store.db import Db
from parley.store.identity import Identity
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
    db: Db,
    *,
    owner: Identity,
    session_id: str,
    name: str,
    content: bytes,
    extracted: Extracted,
) -> FileRow:
    """Keep an upload of the owner's session with its extracted text."""
    await get_session(db, owner=owner, session_id=session_id)
    params = {
        "id": new_id("file"),
        "session_id": session_id,
        "tenant_id": owner.tenant_id,
        "user_id": owner.user_id,
        "name": name,
        "content_type": extracted.content_type,
        "size": len(content),
        "content": content,
        "text": extracted.text,
        "meta": Jsonb(extracted.meta),
    }
    row = await db.row(_STORE, params, FileRow)
    assert row is not None
    return row


# The column `bytes` is the file's size (`FileRow.size`).
_FILE_COLUMNS = "id, name, content_type, bytes AS size, content"
_STORE = f"""
    INSERT INTO files
        (id, session_id, tenant_id, user_id, name, content_type, bytes, content, text, meta)
    VALUES (%(id)s, %(session_id)s, %(tenant_id)s, %(user_id)s, %(name)s, %(content_type)s,
        %(size)s, %(content)s, %(text)s, %(meta)s)
    RETURNING {_FILE_COLUMNS}
"""


async def get_file(db: Db, *, owner: Identity, session_id: str, file_id: str) -> FileRow:
    await get_session(db, owner=owner, session_id=session_id)
    row = await db.row(_GET, {"id": file_id, **_owned(owner, session_id)}, FileRow)
    if row is None:
        raise NotFound(FILE_NOT_FOUND, file_id=file_id)
    return row


def _owned(owner: Identity, session_id: str) -> dict[str, Any]:
    return {"session_id": session_id, "tenant_id": owner.tenant_id, "user_id": owner.user_id}


_OWNED = "session_id = %(session_id)s AND tenant_id = %(tenant_id)s AND user_id = %(user_id)s"
_GET = f"SELECT {_FILE_COLUMNS} FROM files WHERE id = %(id)s AND {_OWNED}"


async def check_owned(
    db: Db, *, owner: Identity, session_id: str, file_ids: Sequence[str]
) -> list[str]:
    """The ids, deduplicated in order, once each is a file of this session and user. A message
    naming any other id is an invalid request (422), whoever that file belongs to: the
    message's session exists, its body is what is wrong."""
    wanted = list(dict.fromkeys(file_ids))
    if not wanted:
        return []
    found = set(await db.value(_OWNED_IDS, {"ids": wanted, **_owned(owner, session_id)}) or ())
    for file_id in wanted:
        if file_id not in found:
            raise InvalidRequest(f"file_ids: {FILE_NOT_FOUND} in this session", field="file_ids")
    return wanted


_OWNED_IDS = f"SELECT array_agg(id) FROM files WHERE id = ANY(%(ids)s) AND {_OWNED}"


async def message_files(db: Db, *, message_id: str) -> list[AttachedFile]:
    """The files a stored message refers to, in the order it named them (for its prompt)."""
    rows = await db.rows(_MESSAGE_FILES, {"message_id": message_id}, _Attached)
    return [AttachedFile(r.id, r.name, r.content_type, r.text, dict(r.meta or {})) for r in rows]


@dataclass(frozen=True)
class _Attached:
    id: str
    name: str
    content_type: str
    text: str
    meta: dict[str, Any] | None


# In the order the message names them; a file of another session (or gone) is left out. A
# message without files holds NULL (or JSON's null, written by the ORM): no elements.
_MESSAGE_FILES = """
    SELECT f.id, f.name, f.content_type, f.text, f.meta
    FROM messages AS m
    CROSS JOIN LATERAL jsonb_array_elements_text(
        CASE WHEN jsonb_typeof(m.file_ids) = 'array' THEN m.file_ids ELSE '[]' END
    ) WITH ORDINALITY AS named(id, ord)
    JOIN files AS f ON f.id = named.id AND f.session_id = m.session_id
    WHERE m.id = %(message_id)s
    ORDER BY named.ord
"""


async def delete_session_files(db: Db, *, session_id: str) -> int:
    """Delete every file of a session (its bytes and text), with the session."""
    return await db.run(_DELETE_SESSION_FILES, {"session_id": session_id})


_DELETE_SESSION_FILES = "DELETE FROM files WHERE session_id = %(session_id)s"
