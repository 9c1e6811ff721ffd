"""Replay tests: the current workflow code must replay histories recorded by earlier code.

Every file in tests/histories/ is the history of a real turn. A change to the workflow that
would break a turn already running in production fails here; such a change needs
`workflow.patched()` (or a new workflow type), not an edit to the recording.

To record the current code's histories next to the old ones:
    PARLEY_RECORD_HISTORY=turn_vN make test
then commit tests/histories/turn_vN_*.json (a tool turn and a confirmation turn; the workflow
tier, tests/test_workflow.py, adds the fallback paths, recorded on the test server).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from temporalio.client import Client, WorkflowHistory
from temporalio.worker import Replayer

from parley.ids import workflow_id_for_turn
from tests.client import ParleyClient
from workflows.turn import TurnWorkflow

HISTORIES = Path(__file__).resolve().parent / "histories"


def scrub(history_json: str) -> str:
    """Worker identities name the recording machine; they play no part in replay."""
    data = json.loads(history_json)
    text = json.dumps(data, indent=1, sort_keys=True)
    return re.sub(r'"identity": "[^"]*"', '"identity": "recorded-worker"', text) + "\n"


@pytest.mark.parametrize("path", sorted(HISTORIES.glob("*.json")), ids=lambda p: p.stem)
async def test_committed_history_replays(path: Path) -> None:
    history = WorkflowHistory.from_json("recorded-turn", path.read_text())
    await Replayer(workflows=[TurnWorkflow]).replay_workflow(history)


def test_there_is_at_least_one_committed_history() -> None:
    assert list(HISTORIES.glob("*.json")), "record one with PARLEY_RECORD_HISTORY"


async def _replay_and_maybe_record(client: Client, turn_id: str, suffix: str) -> None:
    handle = client.get_workflow_handle(workflow_id_for_turn(turn_id))
    await handle.result()  # `done` goes out before the turn's last step (starting its summary)
    history = await handle.fetch_history()
    await Replayer(workflows=[TurnWorkflow]).replay_workflow(history)
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
