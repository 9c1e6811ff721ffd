"""A fresh turn on the session's stack replays on the current workflow code, and can be
recorded into tests/histories/ (PARLEY_RECORD_HISTORY=turn_vN writes turn_vN_tools.json and
turn_vN_confirm.json). The committed histories themselves replay in tests/replay/."""

from __future__ import annotations

import os

from temporalio.client import Client

from parley.ids import workflow_id_for_turn
from parley.workflows.turn import TurnWorkflow
from tests.support.client import ParleyClient
from tests.support.histories import HISTORIES, replayer, scrub


async def _replay_and_maybe_record(client: Client, turn_id: str, suffix: str) -> None:
    handle = client.get_workflow_handle(workflow_id_for_turn(turn_id))
    await handle.result()  # `done` goes out before the turn's last steps (its summary)
    history = await handle.fetch_history()
    await replayer(TurnWorkflow).replay_workflow(history)
    name = os.environ.get("PARLEY_RECORD_HISTORY")
    if name:
        (HISTORIES / f"{name}{suffix}.json").write_text(scrub(history.to_json()))


async def test_a_fresh_tool_turn_replays_and_can_be_recorded(
    priya: ParleyClient, temporal_client: Client
) -> None:
    session_id = await priya.new_session()
    turn_id, events = await priya.turn(session_id, "Where is my order?")
    assert events[-1].type == "done"
    assert any(e.type == "tool" for e in events)
    await _replay_and_maybe_record(temporal_client, turn_id, "_tools")


async def test_a_fresh_confirmation_turn_replays_and_can_be_recorded(
    priya: ParleyClient, temporal_client: Client
) -> None:
    session_id = await priya.new_session()
    await priya.turn(session_id, "Where is my order?")
    posted = await priya.post(session_id, "Can you email me?")
    turn_id = posted.json()["turn_id"]
    events = await priya.events(session_id, turn_id)
    action = events[-1].data["action"]
    confirm = await priya.http.post(f"/v1/sessions/{session_id}/actions/{action['id']}/confirm")
    assert confirm.status_code == 202
    rest = await priya.events(session_id, turn_id, last_event_id=events[-1].id)
    assert rest[-1].type == "done"
    await _replay_and_maybe_record(temporal_client, turn_id, "_confirm")
