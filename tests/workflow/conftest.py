"""The workflow tier: the turn workflow (and the specialist and summary workflows it starts)
alone, on the time-skipping test server, its activities stubbed under their real names.
Timers are skipped, so bounds, expiries and retries run in milliseconds; the full-stack tiers
prove the wiring, these prove the orchestration. One server per module; fresh stubs per test.

Two waits are the worker's own, in real time even here, and the tests keep them short without
changing the workflow: a local activity's retry backoff (a stubbed provider that is down says
when to come back, `QUICK_RETRY` in tests/support/workflow_stubs.py, as a real one's
Retry-After is passed on), and a Stop during a local step, heard when the worker extends the
workflow task it holds (`STOP_HEARD_SOONER` in tests/support/time_skipping.py).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from temporalio.testing import WorkflowEnvironment

from tests.support.time_skipping import time_skipping_server
from tests.support.workflow_stubs import Stubs


@pytest_asyncio.fixture(scope="module")
async def env() -> AsyncIterator[WorkflowEnvironment]:
    async with time_skipping_server() as env:
        yield env


@pytest.fixture
def stubs() -> Stubs:
    return Stubs()
