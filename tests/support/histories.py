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


def replayer(*workflows: type) -> Replayer:
    """A replayer for the tests' determinism checks, without the SDK's deadlock detector. That
    detector fails an activation held past a fixed 2 s, and a loaded machine (or a garbage
    collection over a test process's heap) can hold a replay that long: a clean-clone run
    failed the returns conversation's replay so, on no deadlock. `debug_mode` is the SDK's
    one switch for it, and it does more: activations run inline on the caller's event loop,
    the sandbox lets `breakpoint()` through, and a real hang ends at pytest-timeout instead.
    None of that touches what a replay checks (that the code makes the recorded commands);
    the sandbox's own rules are tested with replayers of their own (tests/replay/
    test_runner.py)."""
    return Replayer(workflows=list(workflows), debug_mode=True)


# The recording of the current build's turns (build 14, which opens each model step in one
# local step): every shape, each to its close.
CURRENT = "turn_v14"
# The previous build's (13: a step's build, beside the input screen, and its call were steps of
# their own), replayed on that build's own code (tests/support/previous_build.py: pinned
# turns end on the workers of the build they started on) until none of its turns can still be
# running. PREVIOUS_BUILD is the last commit with that code.
PREVIOUS = "turn_v13"
PREVIOUS_BUILD = "f4d990d0b097d5f230a11f99e3b65ae47b9bf066"
# The turns recorded before the current build by the full-stack tests of specialists: theirs
# to replay too.
PREVIOUS_DELEGATED = ("specialist_v2_delegated_turn", "specialist_v3_agent_turn")
SHAPES = (
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
    "steered",
    "steered_late",
    "steered_card",
    "steer_declined",
)
# Build 14 took the shapes build 13 had, each in fewer steps.
PREVIOUS_SHAPES = SHAPES


def scrub(history_json: str) -> str:
    """Worker identities and failures' stack traces name the recording machine and its
    paths; they play no part in replay."""
    data = json.loads(history_json)
    text = json.dumps(data, indent=1, sort_keys=True)
    text = re.sub(r'"identity": "[^"]*"', '"identity": "recorded-worker"', text)
    return re.sub(r'"stackTrace": "(?:[^"\\]|\\.)*"', '"stackTrace": ""', text) + "\n"


def previous_build_histories() -> list[Path]:
    """Every committed turn history the previous build recorded (replayed on its code)."""
    names = [f"{PREVIOUS}_{shape}" for shape in PREVIOUS_SHAPES] + list(PREVIOUS_DELEGATED)
    return [HISTORIES / f"{name}.json" for name in names]


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
        await replayer(TurnWorkflow, SpecialistWorkflow).replay_workflow(history)
        if recording:
            (HISTORIES / f"{recording}_{name}.json").write_text(scrub(history.to_json()))
