"""The export workflow's steps: write a user's archive, or record that it failed.

`write_export` reads everything in one REPEATABLE READ transaction, so the archive is one
consistent snapshot however long it takes, while it records progress (sessions written) in
short transactions of its own that the status route reads, and heartbeats the same number.
A retried attempt starts over and overwrites: the archive is written once, at the end.
"""

from __future__ import annotations

from temporalio import activity

from parley.archive import ArchiveWriter
from parley.data_contracts import ExportInput, ExportResult
from parley.statuses import ExportState
from parley.store.db import Database
from parley.store.lifecycle import exports

# Progress is written every this many sessions (and after the last).
PROGRESS_EVERY = 10


class ExportActivities:
    def __init__(self, *, sessions: Database) -> None:
        self._sessions = sessions

    @activity.defn(name="write_export")
    async def write_export(self, inp: ExportInput) -> ExportResult:
        """Write the archive of the export's owner and store it with the export."""
        async with self._sessions() as snapshot:
            await snapshot.repeatable_read()
            export = await exports.read_export(snapshot, export_id=inp.export_id)
            owner = {"tenant_id": export.tenant_id, "user_id": export.user_id}
            session_ids = await exports.user_session_ids(snapshot, **owner)
            await self._progress(inp.export_id, total=len(session_ids))
            writer = ArchiveWriter(
                export_id=export.id, created_at=export.created_at.isoformat(), **owner
            )
            for done, session_id in enumerate(session_ids, 1):
                writer.add_session(await exports.session_content(snapshot, session_id=session_id))
                activity.heartbeat(done)
                if done % PROGRESS_EVERY == 0 or done == len(session_ids):
                    await self._progress(inp.export_id, done=done)
            consent, items = await exports.memory_content(snapshot, **owner)
            writer.add_memory(consent=consent, items=items)
        archive = writer.finish()
        async with self._sessions() as db:
            await exports.finish_export(
                db, export_id=inp.export_id, archive=archive, counts=dict(writer.counts)
            )
            await db.commit()
        return ExportResult(inp.export_id, ExportState.ready, dict(writer.counts))

    async def _progress(self, export_id: str, *, total: int | None = None, done: int = 0) -> None:
        async with self._sessions() as db:
            if total is not None:
                await exports.start_writing(db, export_id=export_id, sessions_total=total)
            else:
                await exports.record_progress(db, export_id=export_id, sessions_done=done)
            await db.commit()

    @activity.defn(name="fail_export")
    async def fail_export(self, inp: ExportInput) -> ExportResult:
        """Record that the archive could not be written (its attempts were spent)."""
        async with self._sessions() as db:
            await exports.fail_export(db, export_id=inp.export_id)
            await db.commit()
        return ExportResult(inp.export_id, ExportState.failed)
