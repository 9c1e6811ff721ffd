"""The import workflow: index an imported conversation's messages for recall, then ask for
the session's summary.

One per import (`import-imp_…`, parley/ids.py). Its steps embed the session's unembedded
messages a batch at a time (`index_import`) until none of the import's is left, then mark the
import done and ask the summary workflow for a pass (`finish_import`). Only the import's and
the session's ids travel through history, never a message. A batch that fails for good ends
the indexing early: full-text search already finds every imported message, and the summary's
runs embed what is left, so the import is still marked done.
"""

from __future__ import annotations

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from parley.activities.imports import ImportActivities
    from parley.data_contracts import IMPORT_WORKFLOW, ImportInput

from parley.workflows.options import INDEX, STORE

# Batches before the run continues as new (a request's largest import takes about eight).
STEPS_PER_RUN = 50


@workflow.defn(name=IMPORT_WORKFLOW)
class ImportWorkflow:
    @workflow.run
    async def run(self, inp: ImportInput) -> None:
        steps = 0
        while True:
            workflow.set_current_details(f"indexing, batch {steps + 1}")
            try:
                remaining = await INDEX.run(
                    ImportActivities.index_import, inp, summary="embed a batch"
                )
            except ActivityError:
                break  # full-text finds them; the summary's runs embed the rest
            steps += 1
            if remaining == 0:
                break
            if steps >= STEPS_PER_RUN:
                workflow.continue_as_new(inp)
        workflow.set_current_details("done")
        await STORE.run(ImportActivities.finish_import, inp, summary="mark done, ask for a summary")
