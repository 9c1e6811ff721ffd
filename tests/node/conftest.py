"""The Node tier: JavaScript clients of Parley (the `ai` package's own client) run by node
against a stack of their own. The packages come from the committed lock: `npm ci` into a
cache folder named by the lock's digest, once per lock (as the web tier needs its browser
installed); a machine that cannot reach the registry fails with npm's words, it never skips.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from temporalio.client import Client

from parley.config import Settings
from parley.gateway.base import ModelRequest
from parley.store.db import Database
from tests.support.models import ControlledModel
from tests.support.toolkit import Stack, own_stack

HERE = Path(__file__).parent
CACHE = Path(os.environ.get("PARLEY_NODE_CACHE", Path.home() / ".cache" / "parley-node"))
# Long enough that a Stop lands mid-answer (about 4 s at the model's pace), short enough that
# the resume test's whole answer is quick.
LONG = " ".join(f"word{i}" for i in range(200))


@pytest.fixture(scope="session")
def node_folder() -> Path:
    """A folder holding the test's files and `node_modules` as the lock pins them."""
    if shutil.which("npm") is None or shutil.which("node") is None:
        pytest.fail("the Node test needs node and npm on PATH (Debian: apt-get install nodejs npm)")
    lock = (HERE / "package-lock.json").read_bytes()
    folder = CACHE / hashlib.sha256(lock + (HERE / "package.json").read_bytes()).hexdigest()[:16]
    if not (folder / "node_modules" / ".package-lock.json").exists():
        # Installed beside it, then renamed: a run that installs at the same time, or one
        # that was killed mid-install, never leaves a half-filled folder behind.
        staging = CACHE / f"{folder.name}.{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        for name in ("package.json", "package-lock.json"):
            shutil.copy(HERE / name, staging / name)
        done = subprocess.run(
            ["npm", "ci", "--no-audit", "--no-fund", "--ignore-scripts"],
            cwd=staging,
            capture_output=True,
            text=True,
            timeout=300,
        )
        if done.returncode != 0:
            pytest.fail(f"npm ci could not install the pinned packages:\n{done.stderr[-3000:]}")
        try:
            staging.rename(folder)
        except OSError:  # another run installed it first
            shutil.rmtree(staging, ignore_errors=True)
    for script in HERE.glob("*.mjs"):
        shutil.copy(script, folder / script.name)
    return folder


@pytest.fixture
def long_reply() -> str:
    """What the stack's model answers to a message with the word "long"."""
    return LONG


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
