"""The retention purge's daily Temporal Schedule, created or brought up to date by every
worker at start (so `make run` and every deployment have it), and visible in the Temporal UI
under Schedules. Its one action starts the purge workflow on the workers' task queue; a run
still going when the next is due makes the next one skip."""

from __future__ import annotations

from temporalio.client import (
    Client,
    Schedule,
    ScheduleActionStartWorkflow,
    ScheduleAlreadyRunningError,
    ScheduleOverlapPolicy,
    SchedulePolicy,
    ScheduleSpec,
    ScheduleUpdate,
    ScheduleUpdateInput,
)

from parley.config import Settings
from parley.data_contracts import PURGE_SCHEDULE_ID, PURGE_WORKFLOW, PurgeInput


def purge_schedule(settings: Settings) -> Schedule:
    return Schedule(
        action=ScheduleActionStartWorkflow(
            PURGE_WORKFLOW,
            PurgeInput(batch_size=settings.retention_batch_size),
            id="retention-purge",
            task_queue=settings.task_queue,
        ),
        spec=ScheduleSpec(cron_expressions=[settings.retention_purge_cron]),
        policy=SchedulePolicy(overlap=ScheduleOverlapPolicy.SKIP),
    )


async def ensure_purge_schedule(client: Client, settings: Settings) -> None:
    """Create the schedule, or replace its spec and action with this worker's settings."""
    schedule = purge_schedule(settings)
    try:
        await client.create_schedule(PURGE_SCHEDULE_ID, schedule)
    except ScheduleAlreadyRunningError:

        def _replace(current: ScheduleUpdateInput) -> ScheduleUpdate:
            schedule.state = current.description.schedule.state  # an operator's pause stays
            return ScheduleUpdate(schedule=schedule)

        await client.get_schedule_handle(PURGE_SCHEDULE_ID).update(_replace)
