"""Importing earlier conversation into a session (parley/imports.py), and following its
indexing."""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime

from fastapi import APIRouter, Response

from parley.api.deps import AppSettings, CurrentUser, DbSession, Temporal
from parley.api.errors import answers
from parley.api.import_schemas import ImportIn, ImportOut
from parley.dispatch.imports import start_import
from parley.errors import IdempotencyKeyReused, InvalidRequest, NotFound, TurnInProgress
from parley.imports import ImportItem, check_items, digest
from parley.statuses import ImportState
from parley.store import imports

log = logging.getLogger(__name__)

router = APIRouter(prefix="/v1/sessions/{session_id}", tags=["imports"], responses=answers())

# The import's own body limit (api/main.py hands it to the body limit).
IMPORT_PATH = r"/v1/sessions/[^/]+/import"
# How long the route waits for Temporal to take the start; a lost start is made by the
# request's repeat (the import is found still pending and started then).
START_TIMEOUT_S = 5.0


@router.post(
    "/import",
    status_code=202,
    responses={
        200: {"model": ImportOut, "description": "The same import again: the first one"},
        **answers(NotFound, TurnInProgress, InvalidRequest, IdempotencyKeyReused),
    },
)
async def import_conversation(
    session_id: str,
    body: ImportIn,
    response: Response,
    db: DbSession,
    user: CurrentUser,
    temporal: Temporal,
    settings: AppSettings,
) -> ImportOut:
    """Store earlier messages as the session's history, with their original times (no turn
    runs); they are indexed for recall in the background, which `status_url` follows. Refused
    while a turn runs; a repeated `client_import_id` is answered with the first import."""
    if len(body.items) > settings.max_import_messages:
        limit = settings.max_import_messages
        raise InvalidRequest(f"items: at most {limit} a request", field="items", limit=limit)
    items = [ImportItem(i.role, i.text, i.created_at) for i in body.items]
    check_items(items, now=datetime.now(UTC), max_chars=settings.max_message_chars)
    imported = await imports.import_messages(
        db,
        owner=user,
        session_id=session_id,
        client_import_id=body.client_import_id,
        digest=digest(items),
        items=items,
    )
    await db.commit()  # the messages and the import's row before its indexing starts
    row = imported.row
    if row.status != ImportState.done:
        try:
            client = await asyncio.wait_for(temporal.get(), START_TIMEOUT_S)
            start = start_import(
                client, import_id=row.id, session_id=session_id, task_queue=settings.task_queue
            )
            await asyncio.wait_for(start, START_TIMEOUT_S)
        except Exception:
            log.warning("could not start import %s now; repeating it starts it", row.id)
    response.status_code = 202 if imported.created else 200
    return ImportOut.build(row)


@router.get("/imports/{import_id}", responses=answers(NotFound))
async def get_import(
    session_id: str, import_id: str, db: DbSession, user: CurrentUser
) -> ImportOut:
    """An import's progress: pending, indexing, then done (owner only)."""
    row = await imports.get_import(db, owner=user, session_id=session_id, import_id=import_id)
    return ImportOut.build(row)
