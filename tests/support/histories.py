"""The committed workflow histories (tests/histories/): where they are, the shapes the current
recording must have, and how a history is made fit to commit. The replay tier replays them;
the tests that record them (PARLEY_RECORD_HISTORY=...) write them here.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from temporalio.client import WorkflowHistory

HISTORIES = Path(__file__).resolve().parents[1] / "histories"
# The recording made with the current workflow code: every shape, each to its close. The
# previous generation's recording (turn_v11) replays too (workflows/patches.py).
CURRENT = "turn_v12"
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
)


def scrub(history_json: str) -> str:
    """Worker identities and failures' stack traces name the recording machine and its
    paths; they play no part in replay."""
    data = json.loads(history_json)
    text = json.dumps(data, indent=1, sort_keys=True)
    text = re.sub(r'"identity": "[^"]*"', '"identity": "recorded-worker"', text)
    return re.sub(r'"stackTrace": "(?:[^"\\]|\\.)*"', '"stackTrace": ""', text) + "\n"


def current(shape: str) -> WorkflowHistory:
    return WorkflowHistory.from_json(shape, (HISTORIES / f"{CURRENT}_{shape}.json").read_text())
