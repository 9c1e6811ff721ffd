"""The summary workflow: fold the turns that left the recent window into the rolling summary.

Started after a turn's answer is stored (the turn's last step, `start_summary`, starts it and
does not wait), so it never delays `done`. One activity does the work, a local one when the
turn that started it asked (turns of the current generation); a crash at any point loses
nothing, because the stored summary only moves forward in one transaction and the next run
starts from wherever it stands.
"""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from activities.memory import MemoryActivities
    from parley.contracts import SUMMARY_WORKFLOW, SummarizeInput, SummarizeResult

from workflows.options import SUMMARY


@workflow.defn(name=SUMMARY_WORKFLOW)
class SummaryWorkflow:
    @workflow.run
    async def run(self, inp: SummarizeInput) -> SummarizeResult:
        run = SUMMARY.run_local if inp.local else SUMMARY.run
        return await run(MemoryActivities.summarize, inp, summary="fold into the summary")
