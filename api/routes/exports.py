"""A user's copy of their own data: ask for an export, follow it, download its archive."""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta

from fastapi import APIRouter, Response

from parley.api.deps import AppSettings, CurrentUser, DbSession, Temporal
from parley.api.errors import answers
from parley.api.schemas import ExportOut
from parley.dispatch.exports import start_export
from parley.errors import ExportExpired, ExportNotReady, NotFound
from parley.store.lifecycle import exports

log = logging.getLogger(__name__)

router = APIRouter(tags=["export"])

# How long the route waits for Temporal to take the start; a lost start is made by the
# caller's next ask (the export is found still pending and started then).
START_TIMEOUT_S = 5.0


@router.get("/v1/me/export", status_code=202, responses=answers())
async def request_export(
    db: DbSession, user: CurrentUser, settings: AppSettings, temporal: Temporal
) -> ExportOut:
    """Export everything the caller's account holds into one archive; answered at once with the
    export's status and archive links (owner only, valid for a limited time). Asking again
    while one is being written, or within a minute of one, answers that one."""
    row, _ = await exports.request_export(
        db,
        tenant_id=user.tenant_id,
        user_id=user.user_id,
        ttl=timedelta(seconds=settings.export_link_ttl_s),
    )
    await db.commit()
    try:
        client = await asyncio.wait_for(temporal.get(), START_TIMEOUT_S)
        await asyncio.wait_for(
            start_export(client, export_id=row.id, task_queue=settings.task_queue),
            START_TIMEOUT_S,
        )
    except Exception:
        log.warning("could not start export %s now; asking again starts it", row.id, exc_info=True)
    return ExportOut.build(row)


@router.get("/v1/me/exports/{export_id}", responses=answers(NotFound, ExportExpired))
async def get_export(export_id: str, db: DbSession, user: CurrentUser) -> ExportOut:
    """The export's state and progress (owner only)."""
    row = await exports.get_export(
        db, tenant_id=user.tenant_id, user_id=user.user_id, export_id=export_id
    )
    return ExportOut.build(row)


@router.get(
    "/v1/me/exports/{export_id}/archive",
    response_class=Response,
    responses={
        200: {"description": "The archive (zip)", "content": {"application/zip": {}}},
        **answers(NotFound, ExportNotReady, ExportExpired),
    },
)
async def download_archive(export_id: str, db: DbSession, user: CurrentUser) -> Response:
    """The export's archive: a zip of a JSON manifest and every session's folder (owner only)."""
    archive = await exports.get_archive(
        db, tenant_id=user.tenant_id, user_id=user.user_id, export_id=export_id
    )
    return Response(
        content=archive,
        media_type="application/zip",
        headers={
            "Content-Disposition": f'attachment; filename="parley-export-{export_id}.zip"',
            "X-Content-Type-Options": "nosniff",
        },
    )
