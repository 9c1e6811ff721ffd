"""The Node tier: JavaScript clients of Parley (the `ai` package's own client) run by node
against a stack of their own. The packages come from the committed lock: `npm ci` into a
cache folder named by the lock's digest, once per lock (as the web tier needs its browser
installed: tests/support/npm.py, tests/support/ai_client.py); a machine that cannot reach
the registry fails with npm's words, it never skips.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from temporalio.client import Client

from parley.config import Settings
from parley.gateway.base import ModelRequest
from parley.store.db import Database
from tests.support.ai_client import installed_client
from tests.support.models import ControlledModel
from tests.support.toolkit import Stack, own_stack

LONG_QUESTION = "A long answer please"
# Long enough that a Stop lands mid-answer (about 4 s at the model's pace), short enough that
# the resume test's whole answer is quick.
LONG = " ".join(f"word{i}" for i in range(200))


@pytest.fixture(scope="session")
def node_folder() -> Path:
    """A folder holding the test's files and `node_modules` as the lock pins them."""
    return installed_client()


@pytest.fixture
def long_question() -> str:
    """A message the stack's model answers with `LONG`, word by word."""
    return LONG_QUESTION


@pytest_asyncio.fixture(scope="module")
async def stack(
    settings: Settings, temporal_client: Client, sessions: Database
) -> AsyncIterator[Stack[ControlledModel]]:
    model = ControlledModel(token_delay_s=0.02)

    def reply(request: ModelRequest) -> str | None:
        users = [m for m in request.messages if m.get("role") == "user"]
        return LONG if users and "long" in str(users[-1].get("content", "")) else None

    model.reply = reply
    # A Stop (the client hangs up) cancels the turn 1 s after, unless a resume came back.
    async with own_stack(
        temporal_client, settings, sessions, model, prefix="aisdk", ai_sdk_stop_grace_s=1.0
    ) as stack:
        yield stack
