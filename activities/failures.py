"""How a step's failures reach the workflow, mapped in one place for every activity.

Two kinds of failure need a name the workflow (and so the client) can rely on, rather than
the exception's class name that Temporal would report:

- `TurnStopped` (the turn ended, or its cancel was recorded, before the step could run):
  final, typed `turn_stopped`, so the workflow stops instead of retrying or failing the turn.
- the database being unreachable: typed `store_unavailable` and retried after a pause long
  enough for a restart, within the step's schedule-to-close bound (workflows/options.py).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from temporalio.exceptions import ApplicationError
from temporalio.worker import ActivityInboundInterceptor, ExecuteActivityInput, Interceptor

from parley.contracts import TURN_STOPPED
from parley.statuses import TurnErrorCode
from store.turns import TurnStopped

# Between attempts of a step that could not reach the database: a restart takes seconds.
STORE_RETRY_DELAY = timedelta(seconds=2)


def _database_unreachable(exc: BaseException) -> bool:
    if isinstance(exc, OperationalError | InterfaceError):
        return True
    if isinstance(exc, DBAPIError) and exc.connection_invalidated:
        return True
    # asyncpg raises the socket's own error when it cannot connect at all.
    return isinstance(exc, ConnectionError | FileNotFoundError)


class FailureInterceptor(Interceptor):
    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _FailureMapper(next)


class _FailureMapper(ActivityInboundInterceptor):
    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        try:
            return await self.next.execute_activity(input)
        except TurnStopped as stopped:
            raise ApplicationError(str(stopped), type=TURN_STOPPED, non_retryable=True) from None
        except Exception as exc:
            if not _database_unreachable(exc):
                raise
            raise ApplicationError(
                f"the database is unreachable ({type(exc).__name__})",
                type=TurnErrorCode.store_unavailable,
                next_retry_delay=STORE_RETRY_DELAY,
            ) from None
