"""The hand-off workflow alone, its steps stubbed under their real names: the summary first,
the claim's wait with the tenant's timeout (a durable timer, skipped here), the customer told
once when nobody came, a late claim still taken, and an end whose signal was lost found by
asking the store.

Build 2 counts the claim's wait in the team's business hours (parley/business_hours.py): a
case opened while the team is away tells the customer when a person is back, and its timer
runs out that many seconds of open time later. Without hours it runs the commands build 1
ran, so build 1's recordings replay on it (tests/replay).

`PARLEY_RECORD_HISTORY=handoff_v2` writes each shape's history to
tests/histories/handoff_v2_<shape>.json for the replay tier.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, time, timedelta
from typing import Any

from temporalio import activity
from temporalio.client import WorkflowHandle
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from parley.business_hours import DAYS, BusinessWeek
from parley.handoffs import (
    HANDOFF_CHANGED_SIGNAL,
    HANDOFF_WORKFLOW,
    AwayNotice,
    HandoffChange,
    HandoffInput,
    HandoffOutcome,
)
from parley.webhooks import WebhookInput
from parley.workflows.handoff import RECHECK, HandoffWorkflow
from tests.support.histories import HISTORIES, replayer, scrub

CLAIM_TIMEOUT_S = 30.0
STEP_DEADLINE_S = 10.0  # a bound on reaching a step, never a wait


@dataclass
class Steps:
    """The case's steps, answering from the store's (scripted) status, recording what ran."""

    status: str = "waiting"  # what the store holds
    ran: list[str] = field(default_factory=list)
    webhooks: list[str] = field(default_factory=list)  # the events delivered, in order
    failing: set[str] = field(default_factory=set)  # events whose delivery fails for good
    away: list[str] = field(default_factory=list)  # when the customer was told a person is back
    reached: dict[str, asyncio.Event] = field(default_factory=dict)

    def _ran(self, name: str) -> None:
        self.ran.append(name)
        self.reached.setdefault(name, asyncio.Event()).set()

    async def until(self, name: str) -> None:
        async with asyncio.timeout(STEP_DEADLINE_S):
            await self.reached.setdefault(name, asyncio.Event()).wait()

    def activities(self) -> list[Any]:
        @activity.defn(name="write_case_summary")
        async def summary(inp: HandoffInput) -> str:
            self._ran("summary")
            return "model"

        @activity.defn(name="tell_unclaimed")
        async def unclaimed(inp: HandoffInput) -> HandoffOutcome:
            self._ran("tell_unclaimed")
            return HandoffOutcome(self.status, told=self.status == "waiting")

        @activity.defn(name="tell_away")
        async def away(notice: AwayNotice) -> bool:
            self.away.append(notice.back_at)
            self._ran("tell_away")
            return True

        @activity.defn(name="deliver_webhook")
        async def webhook(inp: WebhookInput) -> str:
            self.webhooks.append(inp.event)
            if inp.event in self.failing:
                raise ApplicationError("the receiver is down", non_retryable=True)
            return "delivered"

        @activity.defn(name="case_status")
        async def status(inp: HandoffInput) -> HandoffOutcome:
            self._ran("case_status")
            return HandoffOutcome(self.status)

        return [summary, unclaimed, away, status, webhook]


Case = WorkflowHandle[HandoffWorkflow, HandoffOutcome]


async def _signal(case: Case, status: str) -> None:
    await case.signal(HANDOFF_CHANGED_SIGNAL, HandoffChange("hof_test", status))


async def run(
    env: WorkflowEnvironment,
    steps: Steps,
    name: str,
    drive: Any,
    week: BusinessWeek | None = None,
) -> tuple[HandoffOutcome, Any]:
    """Start a case (in the team's hours `week`, if given), let `drive(case)` act on it, and
    return its outcome and history."""
    queue = f"handoff-{uuid.uuid4().hex[:8]}"
    async with Worker(
        env.client, task_queue=queue, workflows=[HandoffWorkflow], activities=steps.activities()
    ):
        case: Case = await env.client.start_workflow(
            HANDOFF_WORKFLOW,
            HandoffInput("hof_test", "ses_test", "northwind", CLAIM_TIMEOUT_S, week),
            id=f"handoff-ses_test-{name}-{uuid.uuid4().hex[:6]}",
            task_queue=queue,
            result_type=HandoffOutcome,
        )
        await drive(case)
        outcome = await case.result()
        history = await case.fetch_history()
    await replayer(HandoffWorkflow).replay_workflow(history)
    recording = os.environ.get("PARLEY_RECORD_HISTORY")
    if recording:
        (HISTORIES / f"{recording}_{name}.json").write_text(scrub(history.to_json()))
    return outcome, history


async def test_a_claimed_case_ends_when_the_agent_hands_it_back(env: WorkflowEnvironment) -> None:
    steps = Steps()

    async def drive(case: Case) -> None:
        await steps.until("summary")
        await _signal(case, "claimed")
        await _signal(case, "handed_back")

    outcome, history = await run(env, steps, "handed_back", drive)
    # Claimed in time: the customer was never told that nobody came.
    assert outcome.status == "handed_back" and steps.ran == ["summary"]
    assert "EVENT_TYPE_TIMER_FIRED" not in history.to_json()
    assert steps.webhooks == ["new"]  # handed back: not `resolved`


async def test_nobody_in_time_tells_the_customer_once_and_a_late_claim_is_taken(
    env: WorkflowEnvironment,
) -> None:
    steps = Steps()

    async def drive(case: Case) -> None:
        await steps.until("summary")
        await env.sleep(CLAIM_TIMEOUT_S + 1)  # the durable timer runs out (time skipped)
        await steps.until("tell_unclaimed")
        assert await case.query(HandoffWorkflow.status) == "waiting"
        await _signal(case, "claimed")
        await _signal(case, "resolved")

    outcome, history = await run(env, steps, "unclaimed", drive)
    assert outcome.status == "resolved"
    assert steps.ran == ["summary", "tell_unclaimed"]
    assert history.to_json().count("EVENT_TYPE_TIMER_FIRED") == 1
    assert sorted(steps.webhooks) == ["new", "resolved", "unclaimed"]  # each once


async def test_a_claim_and_an_end_whose_signals_were_lost_are_found_in_the_store(
    env: WorkflowEnvironment,
) -> None:
    # Claimed before the timer ran out, its signal lost; the team's receiver is down for good.
    steps = Steps(status="claimed", failing={"new", "resolved"})

    async def drive(case: Case) -> None:
        await steps.until("summary")
        await env.sleep(CLAIM_TIMEOUT_S + 1)
        await steps.until("tell_unclaimed")
        steps.status = "resolved"  # and ended, its signal lost too

    before = await env.get_current_time()
    outcome, _ = await run(env, steps, "signals_lost", drive)
    assert outcome.status == "resolved"
    assert steps.ran[:2] == ["summary", "tell_unclaimed"] and steps.ran[-1] == "case_status"
    waited = (await env.get_current_time() - before).total_seconds()
    assert waited >= CLAIM_TIMEOUT_S + RECHECK.total_seconds()
    # Not told (it was claimed): no `unclaimed`; the failed deliveries did not fail the case.
    assert sorted(steps.webhooks) == ["new", "resolved"]


async def test_opened_while_the_team_is_away_the_clock_waits_for_its_hours(
    env: WorkflowEnvironment,
) -> None:
    # The team works one day only, the day after tomorrow (UTC), from 09:00: the case opens
    # while it is away, whatever the time of the run.
    opened = await env.get_current_time()
    day = (opened + timedelta(days=2)).date()
    week = BusinessWeek("UTC", {DAYS[day.weekday()]: "09:00-17:00"})
    back = datetime.combine(day, time(9), tzinfo=UTC)
    steps = Steps()

    async def drive(case: Case) -> None:
        await steps.until("tell_away")
        await env.sleep(back - opened + timedelta(seconds=CLAIM_TIMEOUT_S + 1))
        await steps.until("tell_unclaimed")
        await _signal(case, "claimed")
        await _signal(case, "resolved")

    outcome, history = await run(env, steps, "away_unclaimed", drive, week)
    assert outcome.status == "resolved"
    assert steps.ran == ["summary", "tell_away", "tell_unclaimed"]
    assert steps.away == [back.isoformat()]  # the customer hears when a person is back
    # The claim's timer: the closed time plus the timeout in open time, not the bare timeout
    # (the timers after it are the held case's rechecks).
    timer = [
        e.timer_started_event_attributes.start_to_fire_timeout.ToTimedelta()
        for e in history.events
        if e.HasField("timer_started_event_attributes")
    ][0]
    expected = back + timedelta(seconds=CLAIM_TIMEOUT_S) - opened
    assert abs(timer - expected) < timedelta(seconds=5), (timer, expected)


async def test_opened_in_the_teams_hours_no_one_is_told_it_is_away(
    env: WorkflowEnvironment,
) -> None:
    always = BusinessWeek("UTC", dict.fromkeys(DAYS, "00:00-24:00"))
    steps = Steps()

    async def drive(case: Case) -> None:
        await steps.until("summary")
        await _signal(case, "claimed")
        await _signal(case, "handed_back")

    outcome, _ = await run(env, steps, "in_hours", drive, always)
    assert outcome.status == "handed_back" and steps.ran == ["summary"] and steps.away == []


def test_the_input_carries_ids_a_timeout_and_the_teams_hours_only() -> None:
    inp = HandoffInput("hof_x", "ses_x", "northwind", 5.0)
    assert set(vars(inp)) == {
        "handoff_id",
        "session_id",
        "tenant_id",
        "claim_timeout_s",
        "business_hours",
    }
