"""Files a user attaches to their messages: upload (text, CSV, PDF) and download."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, File, Response, UploadFile

from parley.api.deps import CurrentUser, DbSession
from parley.api.errors import answers
from parley.api.schemas import FileOut
from parley.errors import InvalidRequest, NotFound
from parley.file_text import UnsupportedFile, extract
from parley.store import files

router = APIRouter(prefix="/v1/sessions/{session_id}/files", tags=["files"])

# The upload route's path, for the body limit (api/main.py gives it `max_file_bytes`).
UPLOAD_PATH = r"/v1/sessions/[^/]+/files"


@router.post("", status_code=201, responses=answers(NotFound, InvalidRequest))
async def upload_file(
    session_id: str,
    file: Annotated[UploadFile, File(description="one text, CSV or PDF file")],
    db: DbSession,
    user: CurrentUser,
) -> FileOut:
    """Upload one file into the session; its text is extracted once, here, for the prompts
    of the messages that refer to it."""
    name = (file.filename or "upload").replace("\x00", "")[-255:] or "upload"
    content = await file.read()
    try:
        extracted = extract(name, file.content_type, content)
    except UnsupportedFile as exc:
        raise InvalidRequest(str(exc), field="file") from None
    row = await files.store_file(
        db, owner=user, session_id=session_id, name=name, content=content, extracted=extracted
    )
    await db.commit()
    return FileOut.from_row(row)


@router.get(
    "/{file_id}",
    response_class=Response,
    responses={
        200: {"description": "The file's bytes", "content": {"application/octet-stream": {}}},
        **answers(NotFound),
    },
)
async def download_file(
    session_id: str, file_id: str, db: DbSession, user: CurrentUser
) -> Response:
    """The file's bytes, as uploaded (owner only)."""
    row = await files.get_file(db, owner=user, session_id=session_id, file_id=file_id)
    # An ASCII name without quotes for the header; the bytes are never sniffed as a page.
    safe = row.name.replace('"', "").replace("\\", "").encode("ascii", "replace").decode()
    return Response(
        content=row.content,
        media_type=row.content_type,
        headers={
            "Content-Disposition": f'attachment; filename="{safe}"',
            "X-Content-Type-Options": "nosniff",
        },
    )
