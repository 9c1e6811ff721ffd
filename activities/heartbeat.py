"""Heartbeating on a timer, so a slow call does not look like a dead worker (and a dead
worker is noticed within the heartbeat timeout)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from temporalio import activity

# Well inside the 5 s heartbeat timeouts the workflow sets.
HEARTBEAT_INTERVAL_S = 1.0


def heartbeat() -> None:
    """Heartbeat the running activity; a local activity has none (its workflow task waits for
    it instead), so for one this does nothing."""
    if not activity.info().is_local:
        activity.heartbeat()


@contextlib.asynccontextmanager
async def heartbeating(interval_s: float = HEARTBEAT_INTERVAL_S) -> AsyncIterator[None]:
    async def beat() -> None:
        while True:
            heartbeat()
            await asyncio.sleep(interval_s)

    task = asyncio.create_task(beat())
    try:
        yield
    finally:
        task.cancel()
        # Wait for the beat to stop without taking its CancelledError for ours: if the
        # activity itself is being cancelled, that cancellation must go on propagating.
        await asyncio.wait([task])
