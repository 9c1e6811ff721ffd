"""The operator commands about a user's data: `parley export` and `parley purge`.

Both go through the same workflows the API and the daily schedule start (workflows/export.py,
workflows/retention.py), so a worker must be running; they wait for the result.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from temporalio.client import Client

from parley.config import Settings
from parley.data_contracts import PURGE_WORKFLOW, PurgeInput, PurgeResult
from parley.dispatch.exports import start_export
from parley.ids import new_id
from parley.launch.seeding import require_database
from parley.store.db import Database, create_engine
from parley.store.lifecycle import exports


async def _client(settings: Settings) -> Client:
    return await Client.connect(settings.temporal_address, namespace=settings.temporal_namespace)


async def export_user(settings: Settings, *, tenant_id: str, user_id: str) -> bytes:
    """Write the user's archive through the export workflow and return its bytes. Raises
    LookupError for an unknown user, RuntimeError when the export failed."""
    engine = create_engine(require_database(settings), pool_size=1)
    sessions = Database(engine)
    try:
        async with sessions() as db:
            if not await exports.user_exists(db, tenant_id=tenant_id, user_id=user_id):
                raise LookupError(f"unknown user {user_id!r} in tenant {tenant_id!r}")
            row, _ = await exports.request_export(
                db,
                tenant_id=tenant_id,
                user_id=user_id,
                ttl=timedelta(seconds=settings.export_link_ttl_s),
            )
            await db.commit()
        client = await _client(settings)
        handle = await start_export(client, export_id=row.id, task_queue=settings.task_queue)
        if handle is not None:
            await handle.result()
        async with sessions() as db:
            archive = await exports.read_archive(db, export_id=row.id)
        if archive is None:
            raise RuntimeError(f"export {row.id} failed; see its workflow in the Temporal UI")
        return archive
    finally:
        await engine.dispose()


async def purge_now(
    settings: Settings, *, tenant_id: str | None, now: datetime | None
) -> dict[str, int]:
    """Run the retention purge at once (one tenant, or all), as of `now`; rows by table."""
    client = await _client(settings)
    result = await client.execute_workflow(
        PURGE_WORKFLOW,
        PurgeInput(
            now=now.isoformat() if now is not None else None,
            tenant_id=tenant_id,
            batch_size=settings.retention_batch_size,
        ),
        id=new_id("purge"),
        task_queue=settings.task_queue,
        result_type=PurgeResult,
    )
    return result.purged
