"""The bench's new-shape skeleton (bench/skeleton.py) on the session's dev server and database:
the floor a plain turn is measured against is what it says it is."""

from __future__ import annotations

import uuid

from temporalio.client import Client
from temporalio.worker import Worker

from bench.shape import workflow_shape
from bench.skeleton import EventStep, SkeletonNewShape, skeleton_turns
from parley.config import Settings
from parley.store.db import Database


async def test_the_new_shape_skeleton_is_one_workflow_task_and_one_local_step(
    temporal_client: Client, settings: Settings, sessions: Database
) -> None:
    """The row is read as the floor of issue 25's plain turn: start, one workflow task, one
    local step that stores one event (the statement a streamed frame uses), done."""
    assert settings.database_url is not None
    [turn_id] = await skeleton_turns(settings.database_url, 1)
    queue = f"skeleton-shape-{uuid.uuid4().hex[:8]}"
    step = EventStep(sessions)
    async with Worker(
        temporal_client,
        task_queue=queue,
        workflows=[SkeletonNewShape],
        activities=[step.store_event],
    ):
        workflow_id = f"skeleton-shape-{uuid.uuid4().hex[:8]}"
        stored = await temporal_client.execute_workflow(
            "SkeletonNewShape", turn_id, id=workflow_id, task_queue=queue, result_type=int
        )
    assert stored == 1  # the turn's first event
    shape = await workflow_shape(temporal_client, workflow_id)
    assert shape == {"activities": 0, "local_activities": 1, "workflow_tasks": 1, "upserts": 0}
