"""Watching a session's summary workflow from a test: a turn's workflow closed (its tail step,
which asks for the summary, has run), and the summary's latest run ended or never started."""

from __future__ import annotations

from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError

from parley.ids import summary_workflow_id, workflow_id_for_turn


async def turn_closed(client: Client, turn_id: str) -> None:
    """The turn's workflow has ended: its last step, which asks for the summary, has run."""
    await client.get_workflow_handle(workflow_id_for_turn(turn_id)).result()


async def run_settled(client: Client, session_id: str) -> str | None:
    """The status of the session's latest summary run once it has ended ("none": never
    started); None while it runs."""
    handle = client.get_workflow_handle(summary_workflow_id(session_id=session_id))
    try:
        described = await handle.describe()
    except RPCError:
        return "none"
    if described.status == WorkflowExecutionStatus.RUNNING:
        return None
    return described.status.name if described.status is not None else "?"
