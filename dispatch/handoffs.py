"""Starting a case's workflow, and telling it of a change the store already holds.

A case is committed first and its run started after: by the API (a customer's words opened
it), by the activity that opened it (the model's tool, a tenant's policy), and by the outbox
sweep for any case whose run never wrote its summary (the process died in between).

Starting is idempotent: the workflow id comes from the case, a running run is attached to
(`USE_EXISTING`) and a finished one is never run again (`REJECT_DUPLICATE`). A signal that
cannot be delivered is logged, not raised: the change is committed, and the run asks the
store at its next timeout (workflows/handoff.py).
"""

from __future__ import annotations

import logging
from datetime import timedelta

from temporalio.client import Client
from temporalio.common import (
    SearchAttributePair,
    TypedSearchAttributes,
    WorkflowIDConflictPolicy,
    WorkflowIDReusePolicy,
)
from temporalio.exceptions import WorkflowAlreadyStartedError

from parley.contracts import SA_SESSION_ID, SA_TENANT_ID
from parley.handoffs import (
    HANDOFF_CHANGED_SIGNAL,
    HANDOFF_WORKFLOW,
    HandoffChange,
    HandoffInput,
    case_input,
    handoff_workflow_id,
)
from parley.store import handoffs as store
from parley.store import tenants
from parley.store.db import Database, connect

log = logging.getLogger(__name__)


async def start_handoff(client: Client, inp: HandoffInput, *, task_queue: str) -> None:
    """Start the case's workflow once; a run already started (or finished) stays as it is."""
    try:
        await client.start_workflow(
            HANDOFF_WORKFLOW,
            inp,
            id=handoff_workflow_id(session_id=inp.session_id, handoff_id=inp.handoff_id),
            task_queue=task_queue,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
            search_attributes=TypedSearchAttributes(
                [
                    SearchAttributePair(SA_SESSION_ID, inp.session_id),
                    SearchAttributePair(SA_TENANT_ID, inp.tenant_id),
                ]
            ),
            # Ids only: the reason and the summary may name the customer.
            static_summary=f"Hand-off {inp.handoff_id} of session {inp.session_id}",
        )
    except WorkflowAlreadyStartedError:
        pass  # it ran already


async def start_case_run(
    client: Client,
    sessions: Database,
    case: store.HandoffRow,
    *,
    task_queue: str,
    default_timeout_s: float,
) -> None:
    """Start the committed case's run with its tenant's claim timeout (else
    `default_timeout_s`) and team hours."""
    async with sessions() as db:
        tenant = await tenants.tenant_config(db, tenant_id=case.tenant_id)
    inp = case_input(
        handoff_id=case.id,
        session_id=case.session_id,
        tenant_id=case.tenant_id,
        timeout_s=tenant.handoff_claim_timeout_s,
        default_s=default_timeout_s,
        week=tenant.handoffs().week(),
    )
    await start_handoff(client, inp, task_queue=task_queue)


async def sweep_cases(
    client: Client,
    sessions: Database,
    *,
    task_queue: str,
    grace: timedelta,
    default_timeout_s: float,
) -> int:
    """Start the run of every open case older than `grace` with no summary yet: its start
    was lost (a start of a run that is only slow attaches to it). How many were asked."""
    async with connect(sessions) as db:
        cases = await store.unstarted_cases(db, older_than=grace)
    for case in cases:
        log.warning("starting the run of hand-off %s that nobody started", case.id)
        await start_case_run(
            client, sessions, case, task_queue=task_queue, default_timeout_s=default_timeout_s
        )
    return len(cases)


async def tell_handoff(client: Client, *, session_id: str, change: HandoffChange) -> None:
    """Tell the case's run of a committed claim or end; best effort (see the module)."""
    workflow_id = handoff_workflow_id(session_id=session_id, handoff_id=change.handoff_id)
    try:
        await client.get_workflow_handle(workflow_id).signal(HANDOFF_CHANGED_SIGNAL, change)
    except Exception:
        log.warning("could not tell hand-off %s of %s", change.handoff_id, change.status)
