"""The `ai` package's own client (Node, the version tests/node/package-lock.json pins) run
against a stack: tests/node/chat.test.mjs under node's test runner, with the stack's address
and tokens in its environment. The in-process stack (tests/node/test_ai_sdk_client.py) and
the stack `make run` starts (tests/system/test_make_run.py) run the same script."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from tests.support import npm
from tests.support.stack import REPO

NODE_TESTS = REPO / "tests" / "node"
# The whole script: Priya's turns, a resend, a Stop, a resume and a hand-off, one at a time.
NODE_TIMEOUT_S = 180


@dataclass(frozen=True)
class ChatTarget:
    """Where the script runs, and as whom."""

    url: str
    priya_token: str
    agent_token: str = ""  # Sam's, of Northwind's support team (role `agent`)
    northwind_url: str = ""  # the demo backend, whose /emails lists the email service's sends
    # A message whose answer is long and slow enough that a Stop or a dropped connection
    # lands after its first words and before its end.
    long_question: str = ""
    extra: dict[str, str] = field(default_factory=dict)  # what another script reads


def installed_client() -> Path:
    """A folder holding `node_modules` as the lock pins it and the test scripts."""
    folder = npm.installed(NODE_TESTS)
    for script in NODE_TESTS.glob("*.mjs"):
        shutil.copy(script, folder / script.name)
    return folder


async def run_chat_client(
    folder: Path, target: ChatTarget, *, script: str = "chat.test.mjs"
) -> str:
    """Run `script` against `target`; its report, once every test in it passed."""
    env = {
        **os.environ,
        "PARLEY_URL": target.url,
        "PARLEY_TOKEN": target.priya_token,
        "AGENT_TOKEN": target.agent_token,
        "NORTHWIND_URL": target.northwind_url,
        "LONG_QUESTION": target.long_question,
        **target.extra,
    }
    node = await asyncio.create_subprocess_exec(
        "node",
        "--test-reporter=spec",
        "--test",
        script,
        cwd=folder,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        out, _ = await asyncio.wait_for(node.communicate(), NODE_TIMEOUT_S)
    except TimeoutError:
        node.kill()
        await node.wait()
        raise
    report = out.decode()
    assert node.returncode == 0, report
    assert re.search(r"\bfail 0\b", report), report
    return report


def passed(report: str) -> int:
    """How many tests node's spec reporter counted as passed."""
    found = re.search(r"\bpass (\d+)\b", report)
    return int(found.group(1)) if found else 0
