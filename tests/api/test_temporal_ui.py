"""What an operator reads in the Temporal UI, on the real stack: a turn found through the
visibility API by its session and state, its static summary (its place in the session, no
personal data), its current details as it moves, the one-line summary of each step, and the
link to it that the turn API hands out when the UI address is configured.
"""

from __future__ import annotations

from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.api.sdk.v1 import UserMetadata, WorkflowMetadata
from temporalio.client import Client, WorkflowExecution, WorkflowHandle

from parley.config import Settings
from parley.ids import workflow_id_for_turn
from tests.support.client import ParleyClient
from tests.support.stack import serve_api
from tests.support.toolkit import eventually

UI = "http://ui.example:8233/"
SCHEDULED = EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
TIMER = EventType.EVENT_TYPE_TIMER_STARTED
# A local activity's record (its summary is on the marker).
MARKER = EventType.EVENT_TYPE_MARKER_RECORDED


async def find(client: Client, session_id: str, state: str) -> list[WorkflowExecution]:
    """The session's turns in `state`, as the UI's search box finds them."""
    query = f'ParleySessionId = "{session_id}" AND ParleyTurnState = "{state}"'
    return [w async for w in client.list_workflows(query)]


async def current_details(handle: WorkflowHandle[Any, Any]) -> str:
    """What the UI shows under "Current details" (the SDK's built-in metadata query)."""
    metadata = await handle.query("__temporal_workflow_metadata", result_type=WorkflowMetadata)
    return metadata.current_details


async def step_summaries(client: Client, handle: WorkflowHandle[Any, Any]) -> list[str]:
    """The one-line summary of every activity (each must have one), local ones included, and
    of the timers that have one (the follow-ups' short grace, `workflow.wait`, takes none), in
    order."""
    lines = []
    async for event in handle.fetch_history_events():
        if event.event_type == SCHEDULED:
            assert event.user_metadata.HasField("summary"), event
        shown = (SCHEDULED, TIMER, MARKER)
        if event.event_type in shown and event.user_metadata.HasField("summary"):
            lines.append(await summary_of(client, event.user_metadata))
    return lines


async def summary_of(client: Client, metadata: UserMetadata) -> str:
    [text] = await client.data_converter.decode([metadata.summary])
    return str(text)


async def test_an_operator_finds_a_turn_by_session_and_state_and_reads_its_steps(
    priya: ParleyClient, temporal_client: Client, settings: Settings
) -> None:
    session_id = await priya.new_session()
    first, events = await priya.turn(session_id, "Where is my order?")
    assert events[-1].type == "done"
    tools = [e.data["name"] for e in events if e.type == "tool" and e.data["phase"] == "start"]
    assert tools
    posted = await priya.post(session_id, "Can you email me?")
    second = posted.json()["turn_id"]
    shown = await priya.events(session_id, second)
    action_id = shown[-1].data["action"]["id"]

    # Resting on the card: found by its state, its details name the action and the wait.
    [waiting] = await eventually(
        lambda: find(temporal_client, session_id, "awaiting_confirmation"),
        timeout=10,
        what="the turn awaiting confirmation in visibility",
    )
    assert waiting.id == workflow_id_for_turn(second)
    handle = temporal_client.get_workflow_handle(waiting.id)
    assert await current_details(handle) == (
        f"awaiting_confirmation: {action_id}, expires after {settings.confirmation_timeout_s:g} s"
    )
    confirm = await priya.http.post(f"/v1/sessions/{session_id}/actions/{action_id}/confirm")
    assert confirm.status_code == 202
    assert (await priya.events(session_id, second, last_event_id=shown[-1].id))[-1].type == "done"

    done = await eventually(
        lambda: _both(find(temporal_client, session_id, "completed")),
        timeout=10,
        what="both completed turns in visibility",
    )
    assert {w.id for w in done} == {workflow_id_for_turn(first), workflow_id_for_turn(second)}
    for number, turn_id in ((1, first), (2, second)):
        handle = temporal_client.get_workflow_handle(workflow_id_for_turn(turn_id))
        await handle.result()
        described = await handle.describe()
        assert await described.static_summary() == (
            f"Turn {number} of session {session_id} ({turn_id})"
        )
        answered = (await priya.turn_view(session_id, turn_id))["assistant_message_id"]
        assert await current_details(handle) == f"completed: answered with message {answered}"

    first_steps = await step_summaries(
        temporal_client, temporal_client.get_workflow_handle(workflow_id_for_turn(first))
    )
    # A model step is one step: its context, beside the input screen, then the call.
    assert first_steps[:1] == ["model step 1"]
    assert first_steps[1 : 1 + len(tools)] == tools  # each tool by its name
    assert first_steps[1 + len(tools) :][:1] == ["model step 2"]
    # One step screens the answer, stores it and starts the session's rolling summary.
    assert first_steps[-1] == "finish (completed, screened)"

    second_steps = await step_summaries(
        temporal_client, temporal_client.get_workflow_handle(workflow_id_for_turn(second))
    )
    assert f"show the card for {action_id}" in second_steps
    assert f"confirmation of {action_id} expires" in second_steps  # the wait's timer
    assert f"send email {action_id}" in second_steps
    assert second_steps.index(f"send email {action_id}") < second_steps.index(
        "finish (completed, screened)"
    )
    # Ids, names and step numbers only: nothing the user wrote or their address.
    for line in first_steps + second_steps:
        assert "@" not in line and "order?" not in line


async def _both(found: Any) -> list[WorkflowExecution] | None:
    executions = await found
    return executions if len(executions) == 2 else None


async def test_the_turn_api_links_to_the_workflow_when_the_ui_is_configured(
    priya: ParleyClient, settings: Settings, tokens: dict[str, str]
) -> None:
    session_id = await priya.new_session()
    turn_id, _ = await priya.turn(session_id, "Where is my order?")
    assert (await priya.turn_view(session_id, turn_id))["workflow_url"] is None  # no UI set

    with_ui = settings.model_copy(update={"temporal_ui_url": UI})
    async with serve_api(with_ui) as url:
        operator = ParleyClient(url, tokens["priya"])
        try:
            view = await operator.turn_view(session_id, turn_id)
        finally:
            await operator.aclose()
    assert view["workflow_url"] == (
        f"http://ui.example:8233/namespaces/{settings.temporal_namespace}"
        f"/workflows/{workflow_id_for_turn(turn_id)}"
    )
