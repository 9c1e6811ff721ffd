"""The summary workflow: fold the turns that left the recent window into the rolling summary.

One per session at a time, under the session's id (parley/ids.py `summary_workflow_id`). A
finished turn's last step (`start_summary`) starts it, or signals the run under way (one
signal-with-start call, which attaches to a running workflow of that id), and does not wait,
so it never delays `done`. Each pass is one step, `summarize`, a local activity when a turn's
ending asked last (a regular one when a forgotten message did, dispatch/summaries.py); it
folds everything that has left the window by then, however many turns that is. A turn that
asks while a pass is under way gets one more pass after it: the asks coalesce (three turns
finishing meanwhile cost one pass, not three). With nothing asked since the pass began, the
run ends; a later turn starts the next.

A local pass's result reaches the server only with the workflow task that carries the run's
next command. Were that command the run's end, asks that arrived during the pass would make
the server refuse it, and the worker would replay the run and run the unrecorded pass again
(all its attempts again: a failing summarizer would cost a run as many passes as turns
finished meanwhile). So each pass is recorded first, with a short timer, before the run
decides whether to end.

A crash at any point loses nothing, because the stored summary only moves forward in one
transaction and the next pass starts from wherever it stands. A pass that fails for good
(its bounded attempts spent, workflows/options.py `SUMMARY`) ends the run with it: the asks
it leaves are covered by the next turn's run, and the context builder folds the gap by code
meanwhile. A session that keeps asking while passes run continues as new every
`PASSES_PER_RUN` passes, so no run's history grows without bound.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from parley.activities.memory import MemoryActivities
    from parley.contracts import (
        SUMMARY_DUE_SIGNAL,
        SUMMARY_WORKFLOW,
        SummarizeInput,
        SummarizeResult,
    )

from parley.workflows.options import SUMMARY

# Passes before the run continues as new: each is a handful of events (its step, the
# signals that asked for the next), far below the history's limits.
PASSES_PER_RUN = 20
# How long a run waits after a pass before deciding to end: long enough for one workflow task
# that records the pass, short enough not to keep an idle session's run open.
SETTLE = timedelta(milliseconds=100)


@workflow.defn(name=SUMMARY_WORKFLOW)
class SummaryWorkflow:
    def __init__(self) -> None:
        self._asks = 0  # the start's signal and every one since
        self._latest: SummarizeInput | None = None

    @workflow.signal(name=SUMMARY_DUE_SIGNAL)
    def summary_due(self, inp: SummarizeInput) -> None:
        """A turn finished with work for the summary: one more pass after the current one."""
        self._asks += 1
        self._latest = inp

    @workflow.run
    async def run(self, inp: SummarizeInput) -> SummarizeResult:
        passes = 0
        while True:
            asked = self._asks  # what this pass answers: every ask so far
            latest = self._latest or inp
            workflow.set_current_details(f"pass {passes + 1} after turn {latest.turn_id}")
            run = SUMMARY.run_local if latest.local else SUMMARY.run
            try:
                result = await run(
                    MemoryActivities.summarize, latest, summary="fold into the summary"
                )
            except ActivityError:
                await workflow.sleep(SETTLE)  # the failed pass recorded: the run fails once
                raise
            await workflow.sleep(SETTLE)
            passes += 1
            if self._asks == asked:
                return SummarizeResult(result.through_seq, result.summarized, passes)
            if passes >= PASSES_PER_RUN or workflow.info().is_continue_as_new_suggested():
                # The asks still open travel as the new run's first pass.
                workflow.continue_as_new(self._latest or inp)
