"""The approvals' clock, from the worker's outbox sweep and the API (parley/approvals.py):

- `warn_expiring`: every pending card whose warning is due gets `confirmation_expiring`,
  once (store/actions.py marks it). It runs on each sweep (`outbox_poll_s`, 2 s by default),
  so a warning is shown at most one sweep period (plus the sweep's own work) after it is
  due, and never after the card has lapsed. The turn workflow is not involved: a card resting
  for ten minutes costs it nothing, and its pinned shape does not change.
- `start_renewal`: the workflow that waits for a renewed card's answer (workflows/renewal.py),
  started by the API after it commits the renewal and by the sweep (`sweep_renewals`) when
  that start was lost; the renewal's row is its start outbox, as a turn's row is the turn's.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

from temporalio.client import Client
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import WorkflowAlreadyStartedError

from parley.approvals import RENEWAL_WORKFLOW, RenewalInput
from parley.ids import renewal_workflow_id
from parley.store import approvals
from parley.store.actions import ActionRow
from parley.store.db import Database, connect

log = logging.getLogger(__name__)

# The deployment's lead time when none is configured (`PARLEY_CONFIRMATION_WARNING_S`).
DEFAULT_WARNING_LEAD_S = 60.0
# A renewal's workflow runs at most this much longer than its card's window.
RENEWAL_MARGIN = timedelta(minutes=30)


async def warn_expiring(sessions: Database, *, default_lead_s: float) -> int:
    """Show `confirmation_expiring` on every card whose warning is due; how many."""
    async with sessions() as db:
        warned = await approvals.warn_expiring(db, default_lead_s=default_lead_s)
        await db.commit()
    return len(warned)


async def start_renewal(
    client: Client, sessions: Database, action: ActionRow, *, task_queue: str
) -> None:
    """Start the renewed card's workflow (idempotently: one per renewal, never run twice),
    waiting until the card's `expires_at`, then mark its row started."""
    left = max((action.expires_at - datetime.now(UTC)).total_seconds(), 0.0)
    try:
        await client.start_workflow(
            RENEWAL_WORKFLOW,
            RenewalInput(action.id, action.turn_id, left),
            id=renewal_workflow_id(action_id=action.id),
            task_queue=task_queue,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
            execution_timeout=timedelta(seconds=left) + RENEWAL_MARGIN,
            static_summary=f"Renewed card {action.id} of turn {action.turn_id}",
        )
    except WorkflowAlreadyStartedError:
        pass  # it ran already: its card's status says how it ended
    async with connect(sessions) as conn:  # one statement, autocommit
        await approvals.mark_renewal_started(conn, action_id=action.id)


async def sweep_renewals(
    client: Client, sessions: Database, *, task_queue: str, grace: timedelta
) -> int:
    """Start every renewal whose start was not marked within `grace`; how many."""
    async with connect(sessions) as db:
        unstarted = await approvals.unstarted_renewals(db, older_than=grace)
    for action in unstarted:
        log.warning("starting the renewal %s that the API did not start", action.id)
        await start_renewal(client, sessions, action, task_queue=task_queue)
    return len(unstarted)
