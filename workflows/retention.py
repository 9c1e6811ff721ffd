"""The retention purge: delete what every tenant's retention periods let go, in batches.

Started daily by the Temporal Schedule `parley-retention-purge` (dispatch/retention.py), or
by hand (`parley purge`). The moment the periods count back from is fixed once, at the
start (the input's `now`, or the workflow's clock), so every batch of a run uses the same
cutoffs and a retried or repeated run deletes nothing a first one would not have. The plan
(parley/retention.py) lists each tenant's tables in the order rows must go; each table is
emptied of expired rows one batch per activity until a batch comes back short. A purge long
enough for the server to suggest it continues as new with the same moment. Only ids, table
names and counts travel through history.
"""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from parley.activities.retention import RetentionActivities
    from parley.data_contracts import PURGE_WORKFLOW, PurgeBatchInput, PurgeInput, PurgeResult

from parley.workflows.options import PURGE, STORE


@workflow.defn(name=PURGE_WORKFLOW)
class RetentionPurgeWorkflow:
    @workflow.run
    async def run(self, inp: PurgeInput) -> PurgeResult:
        fixed = PurgeInput(
            now=inp.now or workflow.now().isoformat(),
            tenant_id=inp.tenant_id,
            batch_size=inp.batch_size,
        )
        plan = await STORE.run(RetentionActivities.plan_purge, fixed, summary="plan the purge")
        purged: dict[str, int] = {}
        for task in plan.tasks:
            workflow.set_current_details(f"{task.table} of tenant {task.tenant_id}")
            while True:
                deleted = await PURGE.run(
                    RetentionActivities.purge_batch,
                    PurgeBatchInput(task, fixed.batch_size),
                    summary=f"purge {task.table}",
                )
                purged[task.table] = purged.get(task.table, 0) + deleted
                if deleted < fixed.batch_size:
                    break
                if workflow.info().is_continue_as_new_suggested():
                    # A long purge: a fresh run with the same moment plans again and finds
                    # the tables done so far empty (the metric has counted every batch).
                    workflow.continue_as_new(fixed)
        workflow.set_current_details(f"purged {sum(purged.values())} rows")
        return PurgeResult(purged)
