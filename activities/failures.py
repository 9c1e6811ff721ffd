"""How a step's failures reach the workflow, mapped in one place for every activity.

Two kinds of failure need a name the workflow (and so the client) can rely on, rather than
the exception's class name that Temporal would report:

- `TurnStopped` (the turn ended, or its cancel was recorded, before the step could run):
  final, typed `turn_stopped`, so the workflow stops instead of retrying or failing the turn.
- `TurnSteered` (the ending found a steer newer than the turn's last model call,
  store/steering.py): final, typed `turn_steered`, so the workflow answers it first.
- the database being unreachable: the attempt first waits (heartbeating) for the database to
  answer again, for at most STORE_OUTAGE_WAIT and never past its own start-to-close, then
  fails typed `store_unavailable` and is retried after a short pause, within the step's
  retry policy (workflows/options.py). So a restart of a few seconds costs a streaming model
  call one attempt (its retry resets the stream and streams the answer again) instead of all
  of them, and the model call's five attempts ride out about a minute of outage, no more:
  past that the turn fails with `store_unavailable` once the database is back.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError
from temporalio.worker import ActivityInboundInterceptor, ExecuteActivityInput, Interceptor

from parley.activities.heartbeat import heartbeat
from parley.config import Settings
from parley.contracts import TURN_STEERED, TURN_STOPPED
from parley.statuses import TurnErrorCode
from parley.store.db import Database, is_unreachable, ping
from parley.store.steering import TurnSteered
from parley.store.turns import TurnStopped

# Between attempts of a step that could not reach the database: a restart takes seconds.
STORE_RETRY_DELAY = timedelta(seconds=2)
# Between attempts once the database answers again.
RETRY_WHEN_BACK = timedelta(milliseconds=100)
# How long one attempt waits for the database to come back before it fails, by default
# (`store_outage_wait_s`): five model-call attempts of this plus the retry delay last about
# 70 s, so an outage of a minute is ridden out and one of 90 s fails the turn.
STORE_OUTAGE_WAIT = timedelta(seconds=12)
# Polls of the database while it is away; each one heartbeats.
PROBE_INTERVAL_S = 0.5
# Left of the attempt's start-to-close when the wait gives up, to report the failure in time.
REPORT_MARGIN = timedelta(seconds=2)

Probe = Callable[[], Awaitable[None]]


def database_probe(sessions: Database) -> Probe:
    """A round trip to the database; raises while it is unreachable."""

    async def probe() -> None:
        async with sessions() as db:
            await ping(db)

    return probe


async def wait_for_database(probe: Probe, wait: timedelta = STORE_OUTAGE_WAIT) -> bool:
    """Heartbeat while polling the database, until it answers (True) or this attempt's wait
    is over (False). The wait ends early enough that the attempt can still report."""
    info = activity.info()
    deadline = time.monotonic() + wait.total_seconds()
    if info.start_to_close_timeout:
        ends = info.started_time + info.start_to_close_timeout - REPORT_MARGIN
        deadline = min(deadline, time.monotonic() + (ends - datetime.now(UTC)).total_seconds())
    while time.monotonic() < deadline:
        heartbeat()
        await asyncio.sleep(PROBE_INTERVAL_S)
        try:
            await probe()
        except Exception as exc:
            if not is_unreachable(exc):
                raise
            continue
        return True
    return False


# How long an attempt waits, read when an attempt finds the database away.
Wait = Callable[[], timedelta]


class FailureInterceptor(Interceptor):
    def __init__(self, probe: Probe | None = None, wait: Wait = lambda: STORE_OUTAGE_WAIT) -> None:
        # Without a probe an unreachable database fails the attempt at once.
        self._probe = probe
        self._wait = wait

    @classmethod
    def polling(cls, sessions: Database, settings: Settings) -> FailureInterceptor:
        """A worker's: an attempt that finds the database away polls it for up to
        `store_outage_wait_s`, as the worker's settings say at that moment (a test of a long
        outage shortens it for its own turn)."""
        return cls(
            database_probe(sessions), lambda: timedelta(seconds=settings.store_outage_wait_s)
        )

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _FailureMapper(next, self._probe, self._wait)


class _FailureMapper(ActivityInboundInterceptor):
    def __init__(self, next: ActivityInboundInterceptor, probe: Probe | None, wait: Wait) -> None:
        super().__init__(next)
        self._probe = probe
        self._wait = wait

    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        try:
            return await self.next.execute_activity(input)
        except TurnStopped as stopped:
            raise ApplicationError(str(stopped), type=TURN_STOPPED, non_retryable=True) from None
        except TurnSteered as steered:
            raise ApplicationError(str(steered), type=TURN_STEERED, non_retryable=True) from None
        except Exception as exc:
            if not is_unreachable(exc):
                raise
            back = False
            if self._probe is not None:
                # The attempt fails either way (what it was doing is lost with the
                # connection); waiting here keeps a short outage from spending the retries.
                back = await wait_for_database(self._probe, self._wait())
            raise ApplicationError(
                f"the database is unreachable ({type(exc).__name__})",
                type=TurnErrorCode.store_unavailable,
                next_retry_delay=RETRY_WHEN_BACK if back else STORE_RETRY_DELAY,
            ) from None
