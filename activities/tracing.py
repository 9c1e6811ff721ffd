"""The trace ledger: every attempt of every activity records a span (name, attempt, timing,
outcome, and whatever attributes the step adds with `annotate`). The same interceptor binds
the turn, session and tenant ids to every log line the step writes (`parley.logs`).

Recorded by a worker interceptor, so no activity opens its own span. The span is written in
its own transaction after the step, so a failing step still leaves its span and tracing never
rolls back the work it describes.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Sequence
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import insert, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from temporalio import activity
from temporalio.worker import ActivityInboundInterceptor, ExecuteActivityInput, Interceptor

from parley.logs import log_context
from store.models import TraceSpan, Turn

log = logging.getLogger(__name__)

# The attributes of the span being recorded around the running activity; None outside one
# (a test calling an activity method directly), where `annotate` does nothing.
_current_attrs: ContextVar[dict[str, Any] | None] = ContextVar("span_attrs", default=None)


def annotate(**attrs: Any) -> None:
    """Add attributes (model, tokens, verdict…) to the running activity's span."""
    current = _current_attrs.get()
    if current is not None:
        current.update(attrs)


class TracingInterceptor(Interceptor):
    """Records one span per activity attempt into `trace_spans`."""

    def __init__(self, sessions: async_sessionmaker[AsyncSession]) -> None:
        self._sessions = sessions
        self._owners = TurnOwners(sessions)

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _SpanRecorder(next, self._sessions, self._owners)


class TurnOwners:
    """The session and tenant of a turn, for the log context of its steps: looked up once
    per turn and worker (a turn's steps mostly run on one worker), kept for the last few
    hundred turns."""

    SIZE = 512

    def __init__(self, sessions: async_sessionmaker[AsyncSession]) -> None:
        self._sessions = sessions
        self._known: OrderedDict[str, tuple[str, str]] = OrderedDict()

    async def of(self, turn_id: str) -> tuple[str | None, str | None]:
        known = self._known.get(turn_id)
        if known is not None:
            self._known.move_to_end(turn_id)
            return known
        try:
            async with self._sessions() as db:
                row = (
                    await db.execute(
                        select(Turn.session_id, Turn.tenant_id).where(Turn.id == turn_id)
                    )
                ).first()
        except Exception:  # logs without the ids beat a step that fails for them
            log.warning("could not look up the owners of turn %s", turn_id, exc_info=True)
            return None, None
        if row is None:
            return None, None
        self._known[turn_id] = (row.session_id, row.tenant_id)
        if len(self._known) > self.SIZE:
            self._known.popitem(last=False)
        return row.session_id, row.tenant_id


class _SpanRecorder(ActivityInboundInterceptor):
    def __init__(
        self,
        next: ActivityInboundInterceptor,
        sessions: async_sessionmaker[AsyncSession],
        owners: TurnOwners,
    ) -> None:
        super().__init__(next)
        self._sessions = sessions
        self._owners = owners

    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        turn_id = _turn_id(input.args)
        if turn_id is None:  # every turn step carries its turn; anything else is not traced
            return await self.next.execute_activity(input)
        session_id, tenant_id = await self._owners.of(turn_id)
        with log_context(turn_id=turn_id, session_id=session_id, tenant_id=tenant_id):
            return await self._traced(input, turn_id)

    async def _traced(self, input: ExecuteActivityInput, turn_id: str) -> Any:
        started = datetime.now(UTC)
        attrs: dict[str, Any] = {}
        token = _current_attrs.set(attrs)
        outcome = "ok"
        try:
            return await self.next.execute_activity(input)
        except BaseException as exc:
            outcome = type(exc).__name__
            raise
        finally:
            _current_attrs.reset(token)
            await self._record(turn_id, started, outcome, attrs)

    async def _record(
        self, turn_id: str, started: datetime, outcome: str, attrs: dict[str, Any]
    ) -> None:
        info = activity.info()
        try:
            async with self._sessions() as db:
                # Core, not the unit of work: one span per attempt of every step adds up.
                await db.execute(
                    insert(TraceSpan).values(
                        turn_id=turn_id,
                        name=info.activity_type,
                        attempt=info.attempt,
                        started_at=started,
                        ended_at=datetime.now(UTC),
                        outcome=outcome,
                        attrs=attrs or None,
                    )
                )
                await db.commit()
        except Exception:  # the ledger is best effort; the step's own result stands
            log.warning(
                "could not record trace span %s for %s", info.activity_type, turn_id, exc_info=True
            )


def _turn_id(args: Sequence[Any]) -> str | None:
    """The turn an activity works on, from its one input model."""
    turn_id = getattr(args[0], "turn_id", None) if args else None
    return turn_id if isinstance(turn_id, str) else None
