"""The export workflow: write one user's archive (parley/archive.py) and keep it with the export.

One per export (`export-exp_…`). It has one step that does the work, `write_export`, which
records its progress on the export's row (the status route reads it) and heartbeats it; the
workflow's current details and its `progress` query say which phase it is in. When the
step's attempts are spent the export is marked failed, so its status never stays "running".
Only the export's id travels through history, never the user's data.
"""

from __future__ import annotations

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from parley.activities.exports import ExportActivities
    from parley.data_contracts import EXPORT_WORKFLOW, ExportInput, ExportResult

from parley.workflows.options import EXPORT, STORE


@workflow.defn(name=EXPORT_WORKFLOW)
class ExportWorkflow:
    def __init__(self) -> None:
        self._phase = "starting"

    @workflow.query(name="progress")
    def progress(self) -> str:
        """starting, writing, ready or failed (how far the writing got: the export's status)."""
        return self._phase

    def _enter(self, phase: str) -> None:
        self._phase = phase
        workflow.set_current_details(phase)

    @workflow.run
    async def run(self, inp: ExportInput) -> ExportResult:
        self._enter("writing")
        try:
            result = await EXPORT.run(
                ExportActivities.write_export, inp, summary="write the archive"
            )
        except ActivityError:
            self._enter("failed")
            return await STORE.run(ExportActivities.fail_export, inp, summary="mark it failed")
        self._enter("ready")
        return result
