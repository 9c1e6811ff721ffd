"""Starting an import's workflow (workflows/imports.py) from the API.

The import's messages and row are committed first; the start is idempotent (one workflow id
per import), so a repeat of the import's request starts an import whose start was lost, and
attaches to (or, once closed, leaves) one that ran.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio.client import Client
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import WorkflowAlreadyStartedError

from parley.data_contracts import IMPORT_WORKFLOW, ImportInput
from parley.ids import import_workflow_id

# An import whose indexing takes longer has failed for good (its steps' attempts are spent
# long before); its messages stay searchable by full text.
IMPORT_TIMEOUT = timedelta(hours=1)


async def start_import(client: Client, *, import_id: str, session_id: str, task_queue: str) -> None:
    """Start the import's indexing unless it has run already."""
    try:
        await client.start_workflow(
            IMPORT_WORKFLOW,
            ImportInput(import_id, session_id),
            id=import_workflow_id(import_id),
            task_queue=task_queue,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
            execution_timeout=IMPORT_TIMEOUT,
        )
    except WorkflowAlreadyStartedError:
        pass  # it ran and closed: the import's row says how far it got
