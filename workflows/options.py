"""Timeouts and retries, one named bundle per kind of step the turn workflow takes.

A step's bundle says how long it may run, how Temporal retries it and how it is cancelled;
the workflow names the bundle instead of repeating the numbers at every call, so two calls of
the same kind cannot drift apart. Changing a value changes only what new schedules ask for:
replay compares activity types and order, not their timeouts.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, FailureError
from temporalio.workflow import ActivityCancellationType, ActivityHandle

with workflow.unsafe.imports_passed_through():
    from parley.contracts import TOOL_ATTEMPTS

Arg = TypeVar("Arg")
Result = TypeVar("Result")
# An activity method as the workflow names it: `TurnActivities.build_context`.
ActivityMethod = Callable[[Any, Arg], Awaitable[Result]]


async def to_its_end(step: Awaitable[Result]) -> Result:
    """Run a step with a side effect (a send, a return) to its end: if the workflow is
    cancelled meanwhile, the step still finishes and is recorded before the cancel goes
    through, so what happened to it is never lost."""
    running = asyncio.ensure_future(step)
    try:
        return await asyncio.shield(running)
    except asyncio.CancelledError:
        await running
        raise


async def _failing_as_activity(step: Awaitable[Result], name: str) -> Result:
    """A local activity's last failure reaches the workflow bare (its ApplicationError, not
    wrapped in an ActivityError as a regular activity's is): wrap it, so the workflow handles
    a step's failure one way however the step ran."""
    try:
        return await step
    except ActivityError:
        raise
    except FailureError as err:
        raise ActivityError(
            f"local activity {name} failed",
            scheduled_event_id=0,
            started_event_id=0,
            identity="",
            activity_type=name,
            activity_id="",
            retry_state=None,
        ) from err


@dataclass(frozen=True)
class ActivityOptions:
    start_to_close: timedelta
    retry: RetryPolicy
    # Set for steps that heartbeat, so a dead worker is noticed before start_to_close.
    heartbeat: timedelta | None = None
    cancellation: ActivityCancellationType = ActivityCancellationType.TRY_CANCEL
    # All attempts together, retries and their backoff included: how long the step may keep
    # trying (a store write waits out a database restart, then gives up).
    schedule_to_close: timedelta | None = None

    def run(
        self, activity: ActivityMethod[Arg, Result], arg: Arg, *, summary: str | None = None
    ) -> Awaitable[Result]:
        """Schedule the activity with these options and await its result. `summary` is the
        step's one line in the Temporal UI (metadata on the command: replay ignores it)."""
        return self.start(activity, arg, summary=summary)

    def run_local(
        self, activity: ActivityMethod[Arg, Result], arg: Arg, *, summary: str | None = None
    ) -> asyncio.Task[Result]:
        """Run the activity as a local activity of the worker running the workflow: no task
        for the server to dispatch, its result recorded with the workflow task. For short
        steps without heartbeats whose retry after a crash is harmless. Started at once;
        await the task (or cancel it) later."""
        step = workflow.start_local_activity_method(
            activity,
            arg,
            start_to_close_timeout=self.start_to_close,
            schedule_to_close_timeout=self.schedule_to_close,
            retry_policy=self.retry,
            cancellation_type=self.cancellation,
            summary=summary,
        )
        return asyncio.ensure_future(_failing_as_activity(step, activity.__name__))

    def start(
        self, activity: ActivityMethod[Arg, Result], arg: Arg, *, summary: str | None = None
    ) -> ActivityHandle[Result]:
        """Schedule the activity with these options; await or cancel the handle later."""
        return workflow.start_activity_method(
            activity,
            arg,
            start_to_close_timeout=self.start_to_close,
            schedule_to_close_timeout=self.schedule_to_close,
            heartbeat_timeout=self.heartbeat,
            retry_policy=self.retry,
            cancellation_type=self.cancellation,
            summary=summary,
        )


# Store writes are short; retry them patiently, a database outage of a minute or more
# should not fail a turn (an unreachable database is retried every 2 s, see
# activities/failures.py), and bound all the attempts so that a turn still ends.
STORE = ActivityOptions(
    start_to_close=timedelta(seconds=30),
    retry=RetryPolicy(
        initial_interval=timedelta(milliseconds=200),
        maximum_interval=timedelta(seconds=5),
        maximum_attempts=0,  # unlimited within schedule_to_close
    ),
    schedule_to_close=timedelta(minutes=3),
)

# The model call streams for a while; a short heartbeat timeout notices a dead worker fast.
# On cancel the workflow waits for the activity to stop its upstream stream before cleaning up.
MODEL = ActivityOptions(
    start_to_close=timedelta(minutes=5),
    heartbeat=timedelta(seconds=5),
    retry=RetryPolicy(
        initial_interval=timedelta(milliseconds=500),
        backoff_coefficient=2.0,
        maximum_interval=timedelta(seconds=10),
        maximum_attempts=5,
    ),
    cancellation=ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
)

# A tool call turns its own last failure into a structured result for the model, so these
# retries cover transient errors and crashed workers, never business outcomes.
TOOL = ActivityOptions(
    start_to_close=timedelta(seconds=30),
    heartbeat=timedelta(seconds=5),
    retry=RetryPolicy(
        initial_interval=timedelta(milliseconds=300),
        backoff_coefficient=2.0,
        maximum_interval=timedelta(seconds=3),
        maximum_attempts=TOOL_ATTEMPTS + 2,
    ),
)

# A skill in its sandbox: like a tool call, but long enough for the sandbox's wall clock
# (`PARLEY_SANDBOX_WALL_CLOCK_S`, at most 150 s) and its set-up. A skill over its limit is a
# structured result, not a failure, so the retries cover crashed workers only.
SKILL = ActivityOptions(
    start_to_close=timedelta(seconds=180),
    heartbeat=TOOL.heartbeat,
    retry=RetryPolicy(
        initial_interval=timedelta(seconds=1),
        maximum_interval=timedelta(seconds=5),
        maximum_attempts=3,
    ),
)

# Sending a confirmed email: the same shape as a tool call (the activity records the outcome
# itself and refuses to send twice), named apart so the two can be tuned separately.
SEND = ActivityOptions(
    start_to_close=TOOL.start_to_close, heartbeat=TOOL.heartbeat, retry=TOOL.retry
)

# Screens: quick, retried briefly. The input screen failing closed means a dead moderation
# endpoint stops turns rather than letting unscreened text through.
SCREEN = ActivityOptions(
    start_to_close=timedelta(seconds=10),
    retry=RetryPolicy(initial_interval=timedelta(milliseconds=200), maximum_attempts=3),
)

# The rolling summary: a model call off the hot path. A few attempts for transport errors
# and crashed workers; an answer the summarizer could not read (`bad_summary`) is not asked
# again with the same prompt. So a pass costs at most `maximum_attempts` summarizer requests
# whatever the provider does, and a pass that fails for good ends its run (workflows/
# summary.py): a run that fails costs no more than one pass. It loses nothing: the summary
# stays where it was and the next run covers the gap.
SUMMARY = ActivityOptions(
    start_to_close=timedelta(minutes=2),
    retry=RetryPolicy(
        initial_interval=timedelta(seconds=1),
        backoff_coefficient=2.0,
        maximum_interval=timedelta(seconds=30),
        maximum_attempts=3,
        non_retryable_error_types=["bad_summary"],
    ),
)

# Writing an export's archive: one long read that heartbeats each session, so a dead worker
# is noticed within a minute; a few attempts, each starting over.
EXPORT = ActivityOptions(
    start_to_close=timedelta(minutes=30),
    heartbeat=timedelta(seconds=60),
    retry=RetryPolicy(
        initial_interval=timedelta(seconds=2),
        maximum_interval=timedelta(seconds=30),
        maximum_attempts=3,
    ),
)

# One batch of the retention purge: a short delete, retried patiently (a batch that fails is
# done again by the next attempt or the next day's run; nothing is half-deleted).
PURGE = ActivityOptions(
    start_to_close=timedelta(minutes=2),
    retry=RetryPolicy(
        initial_interval=timedelta(seconds=1),
        maximum_interval=timedelta(seconds=30),
        maximum_attempts=5,
    ),
)

# An erasure's steps: a table emptied batch by batch (heartbeating after each), or the
# subject's workflows deleted one by one. A dead worker is noticed at the heartbeat timeout
# and the step resumes on another; retried without end, because an erasure must finish.
ERASE = ActivityOptions(
    start_to_close=timedelta(minutes=30),
    heartbeat=timedelta(seconds=5),
    retry=RetryPolicy(
        initial_interval=timedelta(seconds=1),
        backoff_coefficient=2.0,
        maximum_interval=timedelta(seconds=30),
        maximum_attempts=0,
    ),
)

# One batch of an import's indexing (workflows/imports.py): embedding a few hundred messages
# is CPU work of seconds; a few attempts for crashed workers. A batch that fails for good
# leaves the rest to full-text search and to the summary's runs, which embed what is left.
INDEX = ActivityOptions(
    start_to_close=timedelta(minutes=2),
    retry=RetryPolicy(
        initial_interval=timedelta(seconds=1),
        maximum_interval=timedelta(seconds=30),
        maximum_attempts=3,
    ),
)

# A hand-off's webhook delivery (activities/handoffs.py): the receiver is the tenant's own
# service, which may be down for a while; the same signed body is sent again with backoff
# for about ten minutes, then the delivery is left `pending` in the log. An address the
# egress rules refuse is not retried (the step says so, non-retryable).
WEBHOOK = ActivityOptions(
    start_to_close=timedelta(seconds=15),
    retry=RetryPolicy(
        initial_interval=timedelta(milliseconds=500),
        backoff_coefficient=2.0,
        maximum_interval=timedelta(minutes=2),
        maximum_attempts=10,
    ),
)
