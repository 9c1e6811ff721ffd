"""The committed workflow histories (tests/histories/): where they are, the shapes the current
recording must have, and how a history is made fit to commit. The replay tier replays them;
the tests that record them (PARLEY_RECORD_HISTORY=...) write them here.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from temporalio.client import Client, WorkflowHistory
from temporalio.worker import Replayer

from parley.ids import specialist_workflow_id, workflow_id_for_turn
from parley.workflows.specialist import SpecialistWorkflow
from parley.workflows.turn import TurnWorkflow

HISTORIES = Path(__file__).resolve().parents[1] / "histories"
# The recording of the current build's turns (build 13, which steers a running answer):
# every shape, each to its close.
CURRENT = "turn_v13"
# The previous build's, replayed until no turn started on it can still be running: a turn
# that is not steered runs the same commands on both (its decision came by signal then).
PREVIOUS = "turn_v12"
PREVIOUS_SHAPES = (
    "plain",
    "tool",
    "confirmed",
    "declined",
    "expired",
    "superseded",
    "cancelled",
    "failed",
    "clarification",
    "fallback",
    "retracted",
    "reanswer",
)
SHAPES = (*PREVIOUS_SHAPES, "steered", "steered_late", "steered_card", "steer_declined")


def scrub(history_json: str) -> str:
    """Worker identities and failures' stack traces name the recording machine and its
    paths; they play no part in replay."""
    data = json.loads(history_json)
    text = json.dumps(data, indent=1, sort_keys=True)
    text = re.sub(r'"identity": "[^"]*"', '"identity": "recorded-worker"', text)
    return re.sub(r'"stackTrace": "(?:[^"\\]|\\.)*"', '"stackTrace": ""', text) + "\n"


def current(shape: str, recording: str = CURRENT) -> WorkflowHistory:
    return WorkflowHistory.from_json(shape, (HISTORIES / f"{recording}_{shape}.json").read_text())


async def replay_delegated_turn(client: Client, turn_id: str, *, names: tuple[str, str]) -> None:
    """A turn that handed work to a specialist, and the specialist, each replayed on the
    current code once closed; with PARLEY_RECORD_HISTORY=specialist_vN written here as
    `specialist_vN_<name>.json` (`names`: the turn's, the specialist's)."""
    recording = os.environ.get("PARLEY_RECORD_HISTORY")
    turn = client.get_workflow_handle(workflow_id_for_turn(turn_id))
    specialist = client.get_workflow_handle(specialist_workflow_id(turn_id=turn_id))
    for name, handle in zip(names, (turn, specialist), strict=True):
        await handle.result()
        history = await handle.fetch_history()
        await Replayer(workflows=[TurnWorkflow, SpecialistWorkflow]).replay_workflow(history)
        if recording:
            (HISTORIES / f"{recording}_{name}.json").write_text(scrub(history.to_json()))
