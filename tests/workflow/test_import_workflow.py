"""The import workflow alone, on the time-skipping server, its two steps stubbed under their
real names over an import kept in memory: batches are embedded until none is left, then the
import is marked done (once, after the last batch); a batch that fails for good still ends
`done`; a long import continues as new and still finishes once.

`PARLEY_RECORD_HISTORY=import_vN` writes each shape's history to
tests/histories/import_vN_<shape>.json for the replay tier.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass, field
from typing import Any

from temporalio import activity
from temporalio.api.sdk.v1 import WorkflowMetadata
from temporalio.client import WorkflowHistory
from temporalio.common import WorkflowIDReusePolicy
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from parley.data_contracts import IMPORT_WORKFLOW, ImportInput
from parley.ids import import_workflow_id
from parley.statuses import ImportState
from parley.workflows.imports import STEPS_PER_RUN, ImportWorkflow
from tests.support.histories import HISTORIES, replayer, scrub


@dataclass
class Importing:
    """One import in memory: how many of its messages lack a vector, embedded `batch` a step,
    its status, and every step that ran."""

    unembedded: int
    batch: int = 256
    fails: bool = False  # every batch fails for good
    status: ImportState = ImportState.pending
    ran: list[str] = field(default_factory=list)

    def activities(self) -> list[Any]:
        @activity.defn(name="index_import")
        async def index_import(inp: ImportInput) -> int:
            self.ran.append("index")
            if self.fails:
                raise ApplicationError("the embedder is gone", non_retryable=True)
            self.unembedded -= min(self.batch, self.unembedded)
            self.status = ImportState.indexing
            return self.unembedded

        @activity.defn(name="finish_import")
        async def finish_import(inp: ImportInput) -> None:
            self.ran.append("finish")
            self.status = ImportState.done

        return [index_import, finish_import]


async def _run(env: WorkflowEnvironment, importing: Importing) -> WorkflowHistory:
    """The workflow to its end, replayed on the current code; returns its last run's
    history. Its current details (what an operator sees) end at `done`."""
    queue = f"import-{uuid.uuid4().hex[:8]}"
    inp = ImportInput(import_id=f"imp_{uuid.uuid4().hex[:12]}", session_id="ses_imported")
    async with Worker(
        env.client, task_queue=queue, workflows=[ImportWorkflow], activities=importing.activities()
    ):
        handle = await env.client.start_workflow(
            IMPORT_WORKFLOW,
            inp,
            id=import_workflow_id(inp.import_id),
            task_queue=queue,
            id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
        )
        await handle.result()
        history = await handle.fetch_history()
        metadata = await handle.query("__temporal_workflow_metadata", result_type=WorkflowMetadata)
    assert metadata.current_details == "done"
    await replayer(ImportWorkflow).replay_workflow(history)
    return history


def _record(name: str, history: WorkflowHistory) -> None:
    recording = os.environ.get("PARLEY_RECORD_HISTORY")
    if recording:
        (HISTORIES / f"{recording}_{name}.json").write_text(scrub(history.to_json()))


async def test_batches_are_embedded_until_none_is_left_then_the_import_is_done(
    env: WorkflowEnvironment,
) -> None:
    importing = Importing(unembedded=600, batch=256)

    history = await _run(env, importing)

    # 600 -> 344 -> 88 -> 0: three batches, then marked done once.
    assert importing.ran == ["index", "index", "index", "finish"]
    assert importing.status == ImportState.done and importing.unembedded == 0
    _record("batches", history)


async def test_an_import_with_nothing_to_embed_is_done_after_one_step(
    env: WorkflowEnvironment,
) -> None:
    importing = Importing(unembedded=0)

    await _run(env, importing)

    assert importing.ran == ["index", "finish"]
    assert importing.status == ImportState.done


async def test_a_batch_that_fails_for_good_still_ends_done(env: WorkflowEnvironment) -> None:
    # Full-text search finds every imported message already; the summary's runs embed the
    # rest. The import is not left `indexing` for ever.
    importing = Importing(unembedded=600, fails=True)

    history = await _run(env, importing)

    assert importing.ran == ["index", "finish"]
    assert importing.status == ImportState.done and importing.unembedded == 600
    _record("gave_up", history)


async def test_a_long_import_continues_as_new_and_finishes_once(env: WorkflowEnvironment) -> None:
    importing = Importing(unembedded=STEPS_PER_RUN + 2, batch=1)

    history = await _run(env, importing)

    assert importing.ran == ["index"] * (STEPS_PER_RUN + 2) + ["finish"]
    assert importing.status == ImportState.done
    # The history fetched is the last run's: the two batches after the continuation.
    started = history.events[0].workflow_execution_started_event_attributes
    assert started.continued_execution_run_id
