"""The erasure workflow: a user's rows (or one deleted session's), deleted for good.

One run per erasure row (`erasure-<id>`), started by `DELETE /v1/me`, `parley erase` or a
session's delete (after the grace period, a durable timer here). It stops the subject's
running turns, deletes their workflow executions, then empties the catalogue's tables in
order (store/lifecycle/erasure_catalogue.py), each step batch by batch and idempotent, so a crash at
any point resumes where the last committed batch left off. A write that raced the erasure (a
summary pass that was already running) is caught by a final count and erased by one more
pass. It ends with the receipt: counts per table, no personal data. Only the erasure's id
and table names travel through history.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from parley.activities.erasure import ErasureActivities
    from parley.erasure import (
        ERASURE_WORKFLOW,
        EraseTableInput,
        ErasureInput,
        ErasureReceipt,
    )

from parley.workflows.options import ERASE, STORE

# Passes over the catalogue before the run gives up on rows that keep coming back.
MAX_PASSES = 3


@workflow.defn(name=ERASURE_WORKFLOW)
class ErasureWorkflow:
    @workflow.run
    async def run(self, inp: ErasureInput) -> ErasureReceipt:
        if inp.grace_s > 0:
            workflow.set_current_details("grace period")
            await workflow.sleep(timedelta(seconds=inp.grace_s))
        plan = await STORE.run(ErasureActivities.begin_erasure, inp, summary="begin")
        if plan.tables:
            await ERASE.run(ErasureActivities.stop_turns, inp, summary="stop running turns")
            await ERASE.run(ErasureActivities.forget_workflows, inp, summary="delete workflows")
        left: dict[str, int] = {}
        for attempt in range(MAX_PASSES if plan.tables else 0):
            for table in plan.tables:
                workflow.set_current_details(f"pass {attempt + 1}: {table}")
                step = EraseTableInput(inp.erasure_id, table)
                await ERASE.run(ErasureActivities.erase_table, step, summary=table)
            left = await STORE.run(ErasureActivities.remaining_rows, inp, summary="check")
            if not left:
                break
        if left:
            raise ApplicationError(f"rows kept coming back: {sorted(left)}", non_retryable=True)
        return await STORE.run(ErasureActivities.finish_erasure, inp, summary="receipt")
