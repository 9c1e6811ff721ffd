"""The erasure workflow's steps: stop the subject's turns, delete their workflow executions,
delete their rows table by table, and close the receipt (workflows/erasure.py). The plan's
first "table" is `eval_drafts`: the subject's captured eval drafts, files counted whole
(store/lifecycle/eval_drafts.py).

Every step is idempotent. A table is emptied in batches, each its own transaction that also
adds its count to the receipt, so a step retried after a crash (a worker killed mid-way)
deletes what is still there and counts nothing twice. Steps read the subject's ids from the
erasure's row, never from their input: history carries the erasure's id and table names.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time

from temporalio import activity
from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.workflowservice.v1 import DeleteWorkflowExecutionRequest
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode

from parley.config import Settings
from parley.erasure import EraseTableInput, ErasureInput, ErasurePlan, ErasureReceipt
from parley.errors import TurnFinished
from parley.ids import (
    renewal_workflow_id,
    specialist_workflow_id,
    summary_workflow_id,
    workflow_id_for_turn,
)
from parley.store import approvals, turns
from parley.store.db import Database
from parley.store.lifecycle import erasure, erasure_catalogue, eval_drafts
from parley.store.lifecycle.erasure_catalogue import Subject

log = logging.getLogger(__name__)

# Turns whose ids one page of `forget_workflows` reads.
PAGE = 200
# How long `stop_turns` waits for the stopped turns to end before erasing anyway (their
# workflows' deletion terminates whatever still runs).
STOP_PATIENCE_S = 20.0
# The fault-injection point between batches (PARLEY_FAULT_KILL_AT, tests only).
KILL_POINT = "erasure_batch"


class ErasureActivities:
    def __init__(
        self,
        *,
        sessions: Database,
        settings: Settings,
        client: Client | None = None,
    ) -> None:
        self._sessions = sessions
        self._settings = settings
        self._client = client
        # One short transaction per batch, however many rows a user has.
        self._batch_rows = settings.erasure_batch_rows

    def attach(self, client: Client) -> None:
        """The Temporal client turns are cancelled and executions deleted with."""
        self._client = client

    async def _subject(self, erasure_id: str) -> Subject | None:
        async with self._sessions() as db:
            return await erasure.subject_of(db, erasure_id=erasure_id)

    @activity.defn(name="begin_erasure")
    async def begin_erasure(self, inp: ErasureInput) -> ErasurePlan:
        """Mark the erasure running; the tables to empty (none once it is done)."""
        async with self._sessions.begin() as db:
            await erasure.mark_started(db, erasure_id=inp.erasure_id)
            subject = await erasure.subject_of(db, erasure_id=inp.erasure_id)
            if subject is None:
                return ErasurePlan(tables=[])
            tables = await erasure_catalogue.tables_for(db, scope=subject.scope)
            return ErasurePlan(tables=[eval_drafts.EVAL_DRAFTS, *tables])

    @activity.defn(name="stop_turns")
    async def stop_turns(self, inp: ErasureInput) -> int:
        """Record a Stop on each of the subject's running turns and cancel its workflow, then
        wait (a bounded while) for them to end; how many were running."""
        assert self._client is not None, "the worker builds this with its Temporal client"
        subject = await self._subject(inp.erasure_id)
        if subject is None:
            return 0
        async with self._sessions() as db:
            running = await erasure_catalogue.unfinished_turns(db, subject=subject)
        for turn_id in running:
            await self._cancel(turn_id)
        deadline = time.monotonic() + STOP_PATIENCE_S
        while running and time.monotonic() < deadline:
            activity.heartbeat()
            await asyncio.sleep(0.5)
            async with self._sessions() as db:
                running = await erasure_catalogue.unfinished_turns(db, subject=subject)
        return len(running)

    async def _cancel(self, turn_id: str) -> None:
        assert self._client is not None
        try:
            async with self._sessions.begin() as db:
                await turns.request_cancel(db, turn_id=turn_id)
        except (TurnFinished, LookupError):
            return
        try:
            await self._client.get_workflow_handle(workflow_id_for_turn(turn_id)).cancel()
        except RPCError as exc:
            if exc.status != RPCStatusCode.NOT_FOUND:
                raise

    @activity.defn(name="forget_workflows")
    async def forget_workflows(self, inp: ErasureInput) -> int:
        """Delete the subject's workflow executions (turns, their specialists and renewed
        cards, the sessions' summaries) with their histories and visibility records, whose
        ids and search attributes name sessions; a running one is terminated. How many were
        found."""
        subject = await self._subject(inp.erasure_id)
        if subject is None:
            return 0
        deleted, after, summaries = 0, "", set[str]()
        while True:
            async with self._sessions() as db:
                page = await erasure_catalogue.workflow_owners(
                    db, subject=subject, after=after, limit=PAGE
                )
            if not page:
                break
            async with self._sessions() as db:  # the waits of cards renewed on these turns
                renewed = await approvals.renewals_of(db, turn_ids=[t for t, _ in page])
            for turn_id, owner in page:
                ids = [workflow_id_for_turn(turn_id), specialist_workflow_id(turn_id=turn_id)]
                ids += [renewal_workflow_id(action_id=a) for a in renewed.get(turn_id, ())]
                if owner not in summaries:
                    summaries.add(owner)
                    ids.append(summary_workflow_id(session_id=owner))
                for workflow_id in ids:
                    deleted += await self._delete_execution(workflow_id)
                activity.heartbeat()
            after = page[-1][0]
        session_id = subject.session_id
        if session_id is not None and session_id not in summaries:  # a session without turns
            deleted += await self._delete_execution(summary_workflow_id(session_id=session_id))
        return deleted

    async def _delete_execution(self, workflow_id: str) -> int:
        """Delete one execution; a running one is terminated first, since the server's own
        terminate-then-delete of a running execution can lose the delete to the workflow's
        own close (a turn finishing its cancel)."""
        assert self._client is not None, "the worker builds this with its Temporal client"
        handle = self._client.get_workflow_handle(workflow_id)
        try:
            if (await handle.describe()).status == WorkflowExecutionStatus.RUNNING:
                await handle.terminate(reason="erasure")
        except RPCError as exc:
            if exc.status == RPCStatusCode.NOT_FOUND:
                return 0
            if exc.status != RPCStatusCode.FAILED_PRECONDITION:  # closed meanwhile
                raise
        request = DeleteWorkflowExecutionRequest(
            namespace=self._client.namespace,
            workflow_execution=WorkflowExecution(workflow_id=workflow_id),
        )
        try:
            await self._client.workflow_service.delete_workflow_execution(request)
        except RPCError as exc:
            if exc.status == RPCStatusCode.NOT_FOUND:
                return 0
            raise
        return 1

    @activity.defn(name="erase_table")
    async def erase_table(self, inp: EraseTableInput) -> int:
        """Empty one table of the subject's rows, batch by batch; the rows this attempt
        deleted (an earlier attempt's are on the receipt already)."""
        if inp.table == eval_drafts.EVAL_DRAFTS:
            return await self._erase_drafts(inp.erasure_id)
        total = 0
        while True:
            async with self._sessions.begin() as db:
                deleted = await erasure.erase_batch(
                    db, erasure_id=inp.erasure_id, table=inp.table, limit=self._batch_rows
                )
            total += deleted
            activity.heartbeat(total)
            if deleted:
                self._fault_point()
            if deleted < self._batch_rows:
                return total

    async def _erase_drafts(self, erasure_id: str) -> int:
        """The subject's captured eval drafts (files): set aside and emptied, then counted
        whole on the receipt (store/lifecycle/eval_drafts.py); how many this attempt set aside."""
        subject = await self._subject(erasure_id)
        if subject is None:
            return 0
        folder = self._settings.eval_capture_dir
        moved = eval_drafts.set_aside(folder, erasure_id=erasure_id, subject=subject)
        aside = len(eval_drafts.set_aside_files(folder, erasure_id=erasure_id))
        if aside:
            async with self._sessions.begin() as db:
                await erasure.set_count(
                    db, erasure_id=erasure_id, key=eval_drafts.EVAL_DRAFTS, n=aside
                )
        return moved

    def _fault_point(self) -> None:
        """Tests only: die here, between two committed batches, as a `kill -9` would."""
        if self._settings.fault_kill_at == KILL_POINT:
            log.warning("fault injection: killed at %s", KILL_POINT)
            os.kill(os.getpid(), signal.SIGKILL)

    @activity.defn(name="remaining_rows")
    async def remaining_rows(self, inp: ErasureInput) -> dict[str, int]:
        """The subject's rows still anywhere in the catalogue (a write that raced the
        erasure); empty when it is complete."""
        subject = await self._subject(inp.erasure_id)
        if subject is None:
            return {}
        async with self._sessions() as db:
            tables = await erasure_catalogue.tables_for(db, scope=subject.scope)
            left = await erasure_catalogue.remaining(db, subject=subject, tables=tables)
        drafts = eval_drafts.drafts_of(self._settings.eval_capture_dir, subject)
        return {**left, eval_drafts.EVAL_DRAFTS: len(drafts)} if drafts else left

    @activity.defn(name="finish_erasure")
    async def finish_erasure(self, inp: ErasureInput) -> ErasureReceipt:
        """Close the receipt: clear the subject's ids, keep the counts."""
        async with self._sessions.begin() as db:
            row = await erasure.finish(db, erasure_id=inp.erasure_id)
        eval_drafts.close(self._settings.eval_capture_dir, erasure_id=inp.erasure_id)
        return ErasureReceipt(inp.erasure_id, dict(row.counts) if row else {})
