"""Starting an export's workflow, from the API or the operator CLI.

The export's row is committed first; starting its workflow is idempotent (one workflow id per
export), so asking again for an export whose start was lost starts it then, and asking while
it runs attaches to the run under way.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio.client import Client, WorkflowHandle
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import WorkflowAlreadyStartedError

from parley.data_contracts import EXPORT_WORKFLOW, ExportInput, ExportResult
from parley.ids import export_workflow_id

# An export that takes longer than this has failed for good (its steps' attempts are spent
# long before).
EXPORT_TIMEOUT = timedelta(hours=2)


async def start_export(
    client: Client, *, export_id: str, task_queue: str
) -> WorkflowHandle[object, ExportResult] | None:
    """Start the export's workflow unless it has run already; its handle, or None if done."""
    try:
        return await client.start_workflow(
            EXPORT_WORKFLOW,
            ExportInput(export_id),
            id=export_workflow_id(export_id),
            task_queue=task_queue,
            result_type=ExportResult,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
            execution_timeout=EXPORT_TIMEOUT,
        )
    except WorkflowAlreadyStartedError:
        return None  # it ran and closed: the export's row says how it ended
