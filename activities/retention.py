"""The retention purge's steps: plan the tables and cutoffs, then delete one batch at a time.

Each batch is its own transaction and its own activity, so a purge of millions of rows holds
no long locks, a crash loses at most one batch's work (which the retry does again: deleting
what is older than a fixed cutoff is idempotent), and every batch is counted in
`parley_retention_rows_purged_total` by table.
"""

from __future__ import annotations

from datetime import datetime

from temporalio import activity

from parley.activities.metrics import RETENTION_PURGED
from parley.config import Settings
from parley.data_contracts import PurgeBatchInput, PurgeInput, PurgePlan, PurgeTask
from parley.retention import purge_plan
from parley.store.db import Database
from parley.store.lifecycle import retention


class RetentionActivities:
    def __init__(self, *, sessions: Database, settings: Settings) -> None:
        self._sessions = sessions
        self._settings = settings

    @activity.defn(name="plan_purge")
    async def plan_purge(self, inp: PurgeInput) -> PurgePlan:
        """Every (tenant, table, cutoff) the periods ask for as of `inp.now`, in order."""
        assert inp.now is not None, "the workflow fixes the moment before planning"
        now = datetime.fromisoformat(inp.now)
        async with self._sessions() as db:
            tenants = await retention.tenants_to_purge(db, tenant_id=inp.tenant_id)
        defaults = self._settings.retention_defaults
        return PurgePlan(
            [
                PurgeTask(each.tenant_id, table, cutoff.isoformat())
                for each in tenants
                for table, cutoff in purge_plan(each.periods.days(defaults), now)
            ]
        )

    @activity.defn(name="purge_batch")
    async def purge_batch(self, inp: PurgeBatchInput) -> int:
        """Delete one batch of one table's expired rows of one tenant; how many went."""
        async with self._sessions() as db:
            deleted = await retention.purge_batch(
                db,
                tenant_id=inp.task.tenant_id,
                table=inp.task.table,
                cutoff=datetime.fromisoformat(inp.task.cutoff),
                limit=inp.batch_size,
            )
            await db.commit()
        if deleted:
            RETENTION_PURGED.labels(inp.task.table).inc(deleted)
        return deleted
