"""The renewal workflow alone (workflows/renewal.py), on the time-skipping server, its two steps
stubbed under their real names over one card kept in memory: a confirm sends once however
often it is delivered, a decline or a window that passes sends nothing, and only the card it
waits for can be decided.

`PARLEY_RECORD_HISTORY=renewal_vN` writes each shape's history to
tests/histories/renewal_vN_<shape>.json for the replay tier.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass, field
from typing import Any

import pytest
from temporalio import activity
from temporalio.client import WorkflowHandle, WorkflowHistory, WorkflowUpdateFailedError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from parley.approvals import RENEWAL_WORKFLOW, RenewalInput
from parley.contracts import RESOLVE_ACTION_UPDATE, ActionInput, ActionResult, ResolveActionSignal
from parley.ids import renewal_workflow_id
from parley.statuses import ActionStatus
from parley.workflows.renewal import RenewalWorkflow
from tests.support.histories import HISTORIES, replayer, scrub

WINDOW_S = 600.0  # skipped by the test server: a lapse takes milliseconds


@dataclass
class Card:
    """One renewed card in memory: its status (the user's stored answer), and the steps run."""

    status: str = ActionStatus.pending
    ran: list[str] = field(default_factory=list)

    def activities(self) -> list[Any]:
        @activity.defn(name="send_email")
        async def send_email(inp: ActionInput) -> ActionResult:
            self.ran.append("send")
            assert self.status == ActionStatus.confirmed, "sent without a confirmation"
            self.status = ActionStatus.executed
            return ActionResult(inp.action_id, self.status)

        @activity.defn(name="expire_action")
        async def expire_action(inp: ActionInput) -> ActionResult:
            self.ran.append("expire")
            if self.status == ActionStatus.pending:
                self.status = ActionStatus.expired
            return ActionResult(inp.action_id, self.status)

        return [send_email, expire_action]


async def _renewal(
    env: WorkflowEnvironment, card: Card, queue: str
) -> WorkflowHandle[Any, ActionResult]:
    action_id = f"act_{uuid.uuid4().hex[:12]}"
    return await env.client.start_workflow(
        RENEWAL_WORKFLOW,
        RenewalInput(action_id, "trn_1", WINDOW_S),
        id=renewal_workflow_id(action_id=action_id),
        task_queue=queue,
        result_type=ActionResult,
    )


def _decision(handle: WorkflowHandle[Any, ActionResult], decision: str) -> ResolveActionSignal:
    return ResolveActionSignal(handle.id.removeprefix("renewal-"), decision)


async def _closed(handle: WorkflowHandle[Any, ActionResult], name: str) -> ActionResult:
    result = await handle.result()
    history = await handle.fetch_history()
    await replayer(RenewalWorkflow).replay_workflow(history)
    _record(name, history)
    return result


def _record(name: str, history: WorkflowHistory) -> None:
    recording = os.environ.get("PARLEY_RECORD_HISTORY")
    if recording:
        (HISTORIES / f"{recording}_{name}.json").write_text(scrub(history.to_json()))


def _worker(env: WorkflowEnvironment, card: Card, queue: str) -> Worker:
    return Worker(
        env.client, task_queue=queue, workflows=[RenewalWorkflow], activities=card.activities()
    )


async def test_a_confirmed_renewal_sends_once(env: WorkflowEnvironment) -> None:
    card, queue = Card(), f"renewal-{uuid.uuid4().hex[:8]}"
    async with _worker(env, card, queue):
        handle = await _renewal(env, card, queue)
        card.status = ActionStatus.confirmed  # the route stores the answer, then delivers it
        confirmed = _decision(handle, "confirmed")
        assert await handle.execute_update(RESOLVE_ACTION_UPDATE, confirmed) == "confirmed"
        # Delivered again (the API's answer was lost, the sweep tried too): taken once.
        assert await handle.execute_update(RESOLVE_ACTION_UPDATE, confirmed) == "confirmed"
        result = await _closed(handle, "confirmed")
    assert result.status == ActionStatus.executed
    assert card.ran == ["send"]


async def test_a_declined_renewal_sends_nothing(env: WorkflowEnvironment) -> None:
    card, queue = Card(), f"renewal-{uuid.uuid4().hex[:8]}"
    async with _worker(env, card, queue):
        handle = await _renewal(env, card, queue)
        card.status = ActionStatus.declined
        await handle.execute_update(RESOLVE_ACTION_UPDATE, _decision(handle, "declined"))
        result = await _closed(handle, "declined")
    assert result.status == ActionStatus.declined
    assert card.ran == []


async def test_a_renewal_nobody_answers_expires_and_sends_nothing(
    env: WorkflowEnvironment,
) -> None:
    card, queue = Card(), f"renewal-{uuid.uuid4().hex[:8]}"
    async with _worker(env, card, queue):
        handle = await _renewal(env, card, queue)
        result = await _closed(handle, "expired")
    assert result.status == ActionStatus.expired
    assert card.ran == ["expire"]


async def test_a_confirm_whose_delivery_was_lost_is_read_when_the_window_ends(
    env: WorkflowEnvironment,
) -> None:
    # Stored by the route, never delivered (Temporal away, then the sweep found no workflow
    # yet): the timer's `expire_action` finds it and the send runs once.
    card, queue = Card(status=ActionStatus.confirmed), f"renewal-{uuid.uuid4().hex[:8]}"
    async with _worker(env, card, queue):
        handle = await _renewal(env, card, queue)
        result = await _closed(handle, "lost_confirm")
    assert result.status == ActionStatus.executed
    assert card.ran == ["expire", "send"]


async def test_only_its_own_card_can_be_decided(env: WorkflowEnvironment) -> None:
    card, queue = Card(), f"renewal-{uuid.uuid4().hex[:8]}"
    async with _worker(env, card, queue):
        handle = await _renewal(env, card, queue)
        with pytest.raises(WorkflowUpdateFailedError):
            await handle.execute_update(
                RESOLVE_ACTION_UPDATE, ResolveActionSignal("act_other", "confirmed")
            )
        with pytest.raises(WorkflowUpdateFailedError):
            await handle.execute_update(RESOLVE_ACTION_UPDATE, _decision(handle, "maybe"))
        await handle.execute_update(RESOLVE_ACTION_UPDATE, _decision(handle, "declined"))
        await handle.result()
    assert card.ran == []
