"""Asking a session's summary workflow for a pass from outside a turn: after a message was
forgotten, the versions that folded it are gone and the next pass rewrites the summary from
the messages that remain (store/lifecycle/forget.py). The same signal-with-start a finished
turn sends (activities/memory.py `start_summary`): a run under way takes it as one more pass."""

from __future__ import annotations

from temporalio.client import Client
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy

from parley.contracts import SUMMARY_DUE_SIGNAL, SUMMARY_WORKFLOW, SummarizeInput
from parley.ids import summary_workflow_id


async def ask_for_summary(client: Client, *, session_id: str, after: str, task_queue: str) -> None:
    """One more pass of the session's summary (`after`: what asked, shown in its details)."""
    inp = SummarizeInput(session_id, after)
    await client.start_workflow(
        SUMMARY_WORKFLOW,
        inp,
        id=summary_workflow_id(session_id=session_id),
        task_queue=task_queue,
        start_signal=SUMMARY_DUE_SIGNAL,
        start_signal_args=[inp],
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
    )
