"""What one turn costs Temporal: its activities, local activities and workflow tasks, counted
from the turn workflow's history (so the skeleton floor can be read for the same shape)."""

from __future__ import annotations

from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from parley.ids import workflow_id_for_turn


async def turn_shape(client: Client, turn_id: str) -> dict[str, Any]:
    return await workflow_shape(client, workflow_id_for_turn(turn_id))


async def workflow_shape(client: Client, workflow_id: str) -> dict[str, Any]:
    """Counted once the workflow has closed: a turn's last steps (the summary's start) come
    after `done`."""
    handle = client.get_workflow_handle(workflow_id)
    await handle.result()
    history = await handle.fetch_history()
    counts = {"activities": 0, "local_activities": 0, "workflow_tasks": 0, "upserts": 0}
    for event in history.events:
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            counts["activities"] += 1
        elif event.event_type == EventType.EVENT_TYPE_MARKER_RECORDED:
            # Patch markers are markers too; local activities are the "..local_activity" ones.
            name = event.marker_recorded_event_attributes.marker_name
            counts["local_activities"] += "local_activity" in name
        elif event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
            counts["workflow_tasks"] += 1
        elif event.event_type == EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES:
            counts["upserts"] += 1
    return counts
