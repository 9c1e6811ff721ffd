"""The worker's connection to Temporal, made once Temporal answers."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from temporalio.client import Client
from temporalio.client import Interceptor as ClientInterceptor
from temporalio.runtime import Runtime

from parley.config import Settings

# A worker started while Temporal is away (a long outage under `make run`, a cluster that
# comes up after its workers) waits for it: exiting would only get it restarted, and a
# supervisor gives up on a process that keeps dying young (launch/supervisor.py).
CONNECT_FIRST_RETRY_S = 0.5
CONNECT_MAX_RETRY_S = 10.0


async def connect_temporal(
    settings: Settings,
    *,
    runtime: Runtime | None = None,
    interceptors: Sequence[ClientInterceptor] = (),
) -> Client:
    """The worker's Temporal client, once Temporal answers; until then it tries again with
    a growing pause, saying so each time."""
    delay = CONNECT_FIRST_RETRY_S
    while True:
        try:
            return await Client.connect(
                settings.temporal_address,
                namespace=settings.temporal_namespace,
                runtime=runtime,
                interceptors=interceptors,
            )
        except RuntimeError as exc:  # the SDK's "failed client connect"
            logging.getLogger(__name__).warning(
                "Temporal at %s is not reachable (%s); trying again in %g s",
                settings.temporal_address,
                exc,
                delay,
            )
        await asyncio.sleep(delay)
        delay = min(delay * 2, CONNECT_MAX_RETRY_S)
