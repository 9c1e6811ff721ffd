"""The state search attribute is set only where an operator looks a turn up by its state:
resting on a confirmation card, and ended (and on the way out of the card, so a confirmed
turn is never still found as awaiting). Every move still reaches the current details."""

from __future__ import annotations

from temporalio.api.enums.v1 import EventType
from temporalio.converter import decode_search_attributes
from temporalio.testing import WorkflowEnvironment

from parley.contracts import SA_TURN_STATE
from parley.workflows.turn import TurnWorkflow
from tests.support.time_skipping import Turn, decide, proposing, replays, turn
from tests.support.workflow_stubs import Stubs

UPSERTED = EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES


async def upserted_states(handle: Turn) -> list[str]:
    states: list[str] = []
    async for event in handle.fetch_history_events():
        if event.event_type == UPSERTED:
            fields = event.upsert_workflow_search_attributes_event_attributes.search_attributes
            states += decode_search_attributes(fields).get(SA_TURN_STATE.name, [])
    return states


async def test_a_plain_turn_sets_its_state_once_it_has_ended(
    env: WorkflowEnvironment, stubs: Stubs
) -> None:
    async with turn(env, stubs) as handle:
        await handle.result()
        assert await upserted_states(handle) == ["completed"]
        assert await handle.query(TurnWorkflow.state) == "completed"
        await replays(handle, "_plain")


async def test_a_confirmed_turn_is_found_awaiting_only_while_it_waits(
    env: WorkflowEnvironment, stubs: Stubs
) -> None:
    stubs.answers = proposing()
    async with turn(env, stubs) as handle:
        await decide(handle, stubs, "confirmed")
        await handle.result()
        states = await upserted_states(handle)
        assert states == ["awaiting_confirmation", "executing_action", "completed"]
        await replays(handle, "_confirmed")
