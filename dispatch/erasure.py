"""Starting erasure workflows; the `erasures` table is their start outbox.

The API (or the CLI) commits the erasure row first, then starts its workflow. If the process
dies in between, the worker's sweep starts it a few seconds later. Starting is idempotent:
the workflow id comes from the erasure, a running one is attached to (`USE_EXISTING`) and a
finished one is never run again (`REJECT_DUPLICATE`).
"""

from __future__ import annotations

import logging
from datetime import timedelta

from temporalio.client import Client, WorkflowHandle
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import WorkflowAlreadyStartedError

from parley.erasure import ERASURE_WORKFLOW, ErasureInput, ErasureReceipt, erasure_workflow_id
from parley.store.db import Database, connect
from parley.store.lifecycle import erasure

log = logging.getLogger(__name__)


async def start_erasure(
    client: Client,
    sessions: Database,
    inp: ErasureInput,
    *,
    task_queue: str,
) -> WorkflowHandle[object, ErasureReceipt]:
    """Start the erasure's workflow (once), then mark its row started."""
    workflow_id = erasure_workflow_id(inp.erasure_id)
    try:
        await client.start_workflow(
            ERASURE_WORKFLOW,
            inp,
            id=workflow_id,
            task_queue=task_queue,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
            # The UI's one line: the erasure's id only, never whose.
            static_summary=f"Erasure {inp.erasure_id}",
        )
    except WorkflowAlreadyStartedError:
        pass  # it ran already; an erasure's receipt is written once
    async with sessions() as db:
        await erasure.mark_workflow_started(db, erasure_id=inp.erasure_id)
        await db.commit()
    return client.get_workflow_handle(workflow_id, result_type=ErasureReceipt)


async def sweep_erasures(
    client: Client,
    sessions: Database,
    *,
    task_queue: str,
    grace: timedelta,
) -> int:
    """Start every erasure whose start was not confirmed within `grace`; how many."""
    async with connect(sessions) as db:
        pending = await erasure.unstarted(db, older_than=grace)
    for row in pending:
        log.warning("starting erasure %s that its requester did not start", row.id)
        inp = ErasureInput(erasure_id=row.id, grace_s=row.grace_s)
        await start_erasure(client, sessions, inp, task_queue=task_queue)
    return len(pending)
