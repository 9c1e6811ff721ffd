"""The hand-off workflow: one case (parley/handoffs.py), from its summary to its end.

One run per case (`handoff-<session>-<case>`, so an operator finds a session's cases by its
id), started by whatever opened the case (the model's tool step, the POST, a turn's ending).
It writes the case summary and tells the tenant's webhook (parley/webhooks.py: `new`,
`unclaimed`, `resolved`), then waits for a person: a claim with the tenant's timeout (a
durable timer, its wait shown in the Temporal UI), counted in the team's business hours
when the tenant has them (build 2: a case opened while the team is away first tells the
customer when a person is back, and its clock starts then); when nobody comes in time, the
customer is told once, the webhook hears `unclaimed`, and the case stays open for a later
claim. It ends when the holder resolves the case or hands it back. A webhook delivery that
keeps failing stays in its log and never fails the case.

The store holds the truth: the API commits each change (a claim, an end) and then tells this
run by signal. A lost signal costs a delay, not the case: at each timeout the run asks the
store, which also makes the "nobody came" message safe against a claim whose signal is late
(the store tells the customer only while the case still waits). Only the case's ids travel
through history, never the conversation or the summary.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError
from temporalio.workflow import ActivityHandle

with workflow.unsafe.imports_passed_through():
    from parley.activities.handoffs import HandoffActivities
    from parley.business_hours import claim_deadline, next_opening
    from parley.handoffs import (
        ENDED_STATUSES,
        HANDOFF_CHANGED_SIGNAL,
        HANDOFF_WORKFLOW,
        AwayNotice,
        HandoffChange,
        HandoffInput,
        HandoffOutcome,
        HandoffStatus,
    )
    from parley.webhooks import WebhookInput

from parley.workflows.options import STORE, SUMMARY, WEBHOOK

# How often a held case asks the store whether it ended without the run hearing of it.
RECHECK = timedelta(hours=1)


@workflow.defn(name=HANDOFF_WORKFLOW)
class HandoffWorkflow:
    def __init__(self) -> None:
        self._status = HandoffStatus.waiting.value

    @workflow.query
    def status(self) -> str:
        """The case's status as this run knows it."""
        return self._status

    @workflow.signal(name=HANDOFF_CHANGED_SIGNAL)
    def changed(self, change: HandoffChange) -> None:
        """The store has a claim or an end of the case."""
        if self._status not in ENDED_STATUSES:
            self._status = change.status

    def _claimed_or_ended(self) -> bool:
        return self._status != HandoffStatus.waiting

    def _ended(self) -> bool:
        return self._status in ENDED_STATUSES

    @workflow.run
    async def run(self, inp: HandoffInput) -> HandoffOutcome:
        workflow.set_current_details("writing the case summary")
        await SUMMARY.run(HandoffActivities.write_case_summary, inp, summary="case summary")
        new = self._notify(inp, "new")  # the team hears of it while the case waits
        wait = await self._claim_clock(inp)
        try:
            await workflow.wait_condition(
                self._claimed_or_ended,
                timeout=wait,
                timeout_summary="nobody claimed the case in time",
            )
        except TimeoutError:
            told = await STORE.run(HandoffActivities.tell_unclaimed, inp, summary="unclaimed")
            self._status = told.status
            if told.told:  # a second notice, once
                await self._delivered(self._notify(inp, "unclaimed"))
            if not self._claimed_or_ended():
                workflow.set_current_details("unclaimed: the customer was told; still open")
                await self._until(self._claimed_or_ended, inp)
        workflow.set_current_details("a person holds the conversation")
        await self._until(self._ended, inp)
        workflow.set_current_details(f"ended: {self._status}")
        if self._status == HandoffStatus.resolved:
            await self._delivered(self._notify(inp, "resolved"))
        await self._delivered(new)
        return HandoffOutcome(self._status)

    async def _claim_clock(self, inp: HandoffInput) -> timedelta:
        """How long the case waits for a claim: the tenant's timeout, counted in the team's
        hours when it has them (build 2; parley/business_hours.py, from `workflow.now()`).
        Opened while the team is away, the customer is told when a person is back."""
        week, wait_s = inp.business_hours, inp.claim_timeout_s
        if week is None:  # all time counts (as build 1 waited)
            workflow.set_current_details(f"waiting for an agent to claim it ({wait_s:g} s)")
            return timedelta(seconds=wait_s)
        now = workflow.now()
        back = next_opening(week, now)
        if back is not None:
            notice = AwayNotice(inp.handoff_id, back.isoformat(), week)
            await STORE.run(HandoffActivities.tell_away, notice, summary="the team is away")
        deadline = claim_deadline(week, now, wait_s)
        workflow.set_current_details(
            f"waiting for an agent to claim it ({wait_s:g} s of business hours, "
            f"until {deadline:%Y-%m-%d %H:%M} UTC)"
        )
        return deadline - now

    def _notify(self, inp: HandoffInput, event: str) -> ActivityHandle[str]:
        return WEBHOOK.start(
            HandoffActivities.deliver_webhook,
            WebhookInput(inp.handoff_id, event),
            summary=f"webhook: {event}",
        )

    async def _delivered(self, delivery: ActivityHandle[str]) -> None:
        """A webhook that stays down is in its delivery log; it never fails the case."""
        try:
            await delivery
        except ActivityError:
            workflow.logger.warning("a hand-off webhook delivery gave up")

    async def _until(self, done: Callable[[], bool], inp: HandoffInput) -> None:
        """Wait for `done` (a signal sets it), asking the store at each `RECHECK`."""
        while not done():
            try:
                await workflow.wait_condition(done, timeout=RECHECK, timeout_summary="recheck")
            except TimeoutError:
                stored = await STORE.run(HandoffActivities.case_status, inp, summary="recheck")
                self._status = stored.status
