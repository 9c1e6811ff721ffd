"""The trace ledger: every attempt of every activity records a span (name, attempt, timing,
outcome, and whatever attributes the step adds with `annotate`). The same interceptor binds
the turn, session and tenant ids to every log line the step writes (`parley.logs`).

Recorded by a worker interceptor, so no activity opens its own span. A span is written
outside the step's transaction, so a failing step still leaves its span and tracing never
rolls back the work it describes. The step does not wait for it: the spans of the steps that
end close together are written together, in one statement, a moment later (`SpanLedger`); a
worker that is killed loses the spans of its last half second, never a step's work.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from temporalio import activity
from temporalio.worker import ActivityInboundInterceptor, ExecuteActivityInput, Interceptor

from parley.logs import late_binder, log_context
from parley.store import traces
from parley.store.db import Database

log = logging.getLogger(__name__)

# How long a written span waits for the spans of other steps, to share their statement (an
# insert and a commit: worker and PostgreSQL CPU). Longer than most plain turns' steps take
# together: a turn's ending drains the ledger anyway (its earlier steps' spans stored before
# its `done`), so a turn's spans take about one statement, where 20 ms took three (one when
# the screen and the build end, the drain, and the ending's own span).
GATHER_S = 0.5

# The attributes of the span being recorded around the running activity; None outside one
# (a test calling an activity method directly), where `annotate` does nothing.
_current_attrs: ContextVar[dict[str, Any] | None] = ContextVar("span_attrs", default=None)
# Where the running step tells the turn's owners it read (`owners_read`); None outside one.
_owners_sink: ContextVar[Callable[[str, str], None] | None] = ContextVar("owners", default=None)
# Keeps a span of a part of the running step (`part`, `adopt`); None outside a traced step.
_part_keeper: ContextVar[Callable[..., None] | None] = ContextVar("part_keeper", default=None)

# The steps whose context build reads the turn's session and tenant with its turn, so that
# neither they nor an input screen beside the build have them looked up (unless the build has
# not told them within `TurnOwners.REPORT_WITHIN_S`): a model step opened in one step (build
# 14), and build 13's separate build and screen.
TOLD_OWNERS = frozenset({"open_step", "screen_input", "build_context"})


def owners_read(*, session_id: str, tenant_id: str) -> None:
    """The running step read its turn's session and tenant: its log lines (and those of the
    turn's other steps on this worker) name them, with no lookup of their own."""
    sink = _owners_sink.get()
    if sink is not None:
        sink(session_id, tenant_id)


@contextmanager
def part(name: str) -> Iterator[None]:
    """A part of the running step, with a span of its own named `name` beside the step's:
    the opening step (activities/opening.py) records its build, its input screen and its
    model call as the steps they were before build 14, so a turn's trace still shows each.
    What the part `annotate`s goes on its own span."""
    keep = _part_keeper.get()
    if keep is None:
        yield
        return
    started = datetime.now(UTC)
    attrs: dict[str, Any] = {}
    token = _current_attrs.set(attrs)
    outcome = "ok"
    try:
        yield
    except BaseException as exc:
        outcome = type(exc).__name__
        raise
    finally:
        _current_attrs.reset(token)
        keep(name, started, outcome, attrs)


@dataclass
class Detached:
    """A part run before the step it belongs to (a turn's first context build, begun beside
    the workflow's start: activities/early_build.py): its span, and the owners it read,
    kept until the step `adopt`s it."""

    started: datetime = field(default_factory=lambda: datetime.now(UTC))
    ended: datetime | None = None
    outcome: str = "ok"
    attrs: dict[str, Any] = field(default_factory=dict)
    owners: tuple[str, str] | None = None


@contextmanager
def detached(record: Detached) -> Iterator[None]:
    """Run a part outside any step, into `record`: what it `annotate`s, its outcome and end,
    and the owners it reads."""
    record.started = datetime.now(UTC)
    attrs = _current_attrs.set(record.attrs)
    sink = _owners_sink.set(lambda s, t: setattr(record, "owners", (s, t)))
    try:
        yield
    except BaseException as exc:
        record.outcome = type(exc).__name__
        raise
    finally:
        record.ended = datetime.now(UTC)
        _owners_sink.reset(sink)
        _current_attrs.reset(attrs)


def adopt(name: str, record: Detached) -> None:
    """A part run before the running step (`detached`), recorded as the step's part named
    `name` with its own times; the owners it read are told as the step's."""
    keep = _part_keeper.get()
    if keep is not None:
        keep(name, record.started, record.outcome, record.attrs, ended=record.ended)
    if record.owners is not None:
        owners_read(session_id=record.owners[0], tenant_id=record.owners[1])


def annotate(**attrs: Any) -> None:
    """Add attributes (model, tokens, verdict…) to the running activity's span."""
    current = _current_attrs.get()
    if current is not None:
        current.update(attrs)


class TracingInterceptor(Interceptor):
    """Records one span per activity attempt into `trace_spans`."""

    def __init__(
        self,
        sessions: Database,
        trace_id: Callable[[], str | None] = lambda: None,  # the OTel trace, when tracing is on
    ) -> None:
        self.ledger = SpanLedger(sessions)
        self._owners = TurnOwners(sessions)
        self._trace_id = trace_id

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _SpanRecorder(next, self.ledger, self._owners, self._trace_id)


class SpanLedger:
    """Spans on their way to `trace_spans`. A span is kept at once; the first one kept starts
    a short wait, then every span kept by then is written in one statement, in autocommit.
    `drain` writes what is kept at once: a turn's ending step drains before it runs, so the
    spans of the steps before it are stored before the turn's `done` or `error` goes out."""

    def __init__(self, sessions: Database, gather_s: float = GATHER_S) -> None:
        self._sessions = sessions
        self._gather_s = gather_s
        self._kept: list[dict[str, Any]] = []
        self._waiting: asyncio.Task[None] | None = None
        self._writing: set[asyncio.Future[None]] = set()

    def keep(self, span: dict[str, Any]) -> None:
        self._kept.append(span)
        if self._waiting is None:
            # In a context of its own: the write belongs to no step (nor to its log ids).
            self._waiting = asyncio.get_running_loop().create_task(
                self._after_the_wait(), context=contextvars.Context()
            )

    async def drain(self) -> None:
        """Write what is kept, and wait for the writes under way."""
        await self._write_kept()
        while self._writing:
            await asyncio.wait([asyncio.shield(w) for w in self._writing])

    async def _after_the_wait(self) -> None:
        try:
            await asyncio.sleep(self._gather_s)
        finally:
            self._waiting = None
        await self._write_kept()

    async def _write_kept(self) -> None:
        while self._kept:
            spans, self._kept = self._kept, []
            write = asyncio.ensure_future(self._write(spans))
            self._writing.add(write)
            write.add_done_callback(self._writing.discard)
            await asyncio.shield(write)

    async def _write(self, spans: list[dict[str, Any]]) -> None:
        try:
            await traces.insert_spans(self._sessions, spans)
        except Exception:  # the ledger is best effort; the steps' own results stand
            log.warning("could not record %d trace spans", len(spans), exc_info=True)


# The steps that end a turn or rest it on a card: the ledger is drained before they run.
ENDINGS = frozenset({"finish_turn", "fail_turn", "cancel_turn", "request_confirmation"})


class TurnOwners:
    """The session and tenant of a turn, for the log context of its steps: known once per
    turn and worker (a turn's steps mostly run on one worker), kept for the last few hundred
    turns. The context build reads them with its turn and tells them (`read`), so the steps
    that start with it, the input screen and the build, have none looked up; another step
    has them looked up (`ask`), once, and no step waits for them."""

    SIZE = 512
    # How long a step told the owners by the build waits for them before looking them up
    # (no step waits: only its log lines lack the ids meanwhile). Long enough that a build
    # slowed by a busy machine still tells them: the lookup is for a build that failed.
    REPORT_WITHIN_S = 5.0

    def __init__(self, sessions: Database) -> None:
        self._sessions = sessions
        self._known: OrderedDict[str, tuple[str, str]] = OrderedDict()
        self._asked: dict[str, asyncio.Future[tuple[str, str] | None]] = {}

    def known(self, turn_id: str) -> tuple[str, str] | None:
        """The turn's owners if this worker has looked them up already."""
        known = self._known.get(turn_id)
        if known is not None:
            self._known.move_to_end(turn_id)
        return known

    def ask(self, turn_id: str) -> asyncio.Future[tuple[str, str] | None]:
        """The lookup of the turn's owners, started now or already under way."""
        asked = self._asked.get(turn_id)
        if asked is None:
            asked = self._asked[turn_id] = asyncio.ensure_future(self._look_up(turn_id))
            asked.add_done_callback(lambda _: self._asked.pop(turn_id, None))
        return asked

    def told(self, turn_id: str) -> asyncio.Future[tuple[str, str] | None]:
        """The owners a step will tell (`read`), or a lookup under way; looked up after all
        when nobody has told them within `REPORT_WITHIN_S` (the build failed first)."""
        asked = self._asked.get(turn_id)
        if asked is None:
            loop = asyncio.get_running_loop()
            waiting = self._asked[turn_id] = loop.create_future()
            waiting.add_done_callback(lambda _: self._asked.pop(turn_id, None))
            loop.call_later(self.REPORT_WITHIN_S, self._fall_back, turn_id, waiting)
            return waiting
        return asked

    def read(self, turn_id: str, session_id: str, tenant_id: str) -> None:
        """A step read the turn's owners: kept, and given to the steps waiting for them."""
        self._keep(turn_id, (session_id, tenant_id))
        waiting = self._asked.get(turn_id)
        if waiting is not None and not isinstance(waiting, asyncio.Task) and not waiting.done():
            waiting.set_result((session_id, tenant_id))

    def _fall_back(self, turn_id: str, waiting: asyncio.Future[tuple[str, str] | None]) -> None:
        if waiting.done():
            return
        looked_up = asyncio.ensure_future(self._look_up(turn_id))

        def answer(done: asyncio.Future[tuple[str, str] | None]) -> None:
            if not waiting.done():  # `_look_up` raises nothing; None when it failed
                waiting.set_result(None if done.cancelled() else done.result())

        looked_up.add_done_callback(answer)

    def _keep(self, turn_id: str, owners: tuple[str, str]) -> None:
        self._known[turn_id] = owners
        self._known.move_to_end(turn_id)
        if len(self._known) > self.SIZE:
            self._known.popitem(last=False)

    async def _look_up(self, turn_id: str) -> tuple[str, str] | None:
        try:
            row = await traces.turn_owners(self._sessions, turn_id)
        except Exception:  # logs without the ids beat a step that fails for them
            log.warning("could not look up the owners of turn %s", turn_id, exc_info=True)
            return None
        if row is None:
            return None
        self._keep(turn_id, (row.session_id, row.tenant_id))
        return row.session_id, row.tenant_id


class _SpanRecorder(ActivityInboundInterceptor):
    def __init__(
        self,
        next: ActivityInboundInterceptor,
        ledger: SpanLedger,
        owners: TurnOwners,
        trace_id: Callable[[], str | None],
    ) -> None:
        super().__init__(next)
        self._ledger = ledger
        self._owners = owners
        self._trace_id = trace_id

    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        turn_id = _turn_id(input.args)
        if turn_id is None:  # every turn step carries its turn; anything else is not traced
            return await self.next.execute_activity(input)
        known = self._owners.known(turn_id)
        session_id, tenant_id = known if known is not None else (None, None)
        with log_context(turn_id=turn_id, session_id=session_id, tenant_id=tenant_id):
            if known is None:
                # A turn's first step on this worker does not wait for the lookup (a round
                # trip on the way to the first token): its lines name the session and tenant
                # from when the lookup is back, or the build tells them.
                told = activity.info().activity_type in TOLD_OWNERS
                owners = self._owners.told(turn_id) if told else self._owners.ask(turn_id)
                owners.add_done_callback(_binding(late_binder()))
            sink = _owners_sink.set(lambda s, t: self._owners.read(turn_id, s, t))
            try:
                return await self._traced(input, turn_id)
            finally:
                _owners_sink.reset(sink)

    async def _traced(self, input: ExecuteActivityInput, turn_id: str) -> Any:
        if activity.info().activity_type in ENDINGS:
            await self._ledger.drain()
        started = datetime.now(UTC)
        attrs: dict[str, Any] = {}
        token = _current_attrs.set(attrs)
        info = activity.info()

        def keep(
            name: str,
            began: datetime,
            outcome: str,
            attrs: dict[str, Any],
            ended: datetime | None = None,
        ) -> None:
            self._ledger.keep(
                {
                    "turn_id": turn_id,
                    "name": name,
                    "attempt": info.attempt,
                    "started_at": began.isoformat(),
                    "ended_at": (ended or datetime.now(UTC)).isoformat(),
                    "outcome": outcome,
                    "attrs": attrs or None,
                    "otel_trace_id": self._trace_id(),
                }
            )

        parts = _part_keeper.set(keep)
        outcome = "ok"
        try:
            return await self.next.execute_activity(input)
        except BaseException as exc:
            outcome = type(exc).__name__
            raise
        finally:
            _part_keeper.reset(parts)
            _current_attrs.reset(token)
            keep(info.activity_type, started, outcome, attrs)


def _binding(
    bind: Callable[..., None],
) -> Callable[[asyncio.Future[tuple[str, str] | None]], None]:
    """A callback that binds a finished lookup's owners with `bind`."""

    def bound(looked_up: asyncio.Future[tuple[str, str] | None]) -> None:
        if looked_up.cancelled() or looked_up.exception() is not None:
            return
        owners = looked_up.result()
        if owners is not None:
            bind(session_id=owners[0], tenant_id=owners[1])

    return bound


def _turn_id(args: Sequence[Any]) -> str | None:
    """The turn an activity works on, from its one input model."""
    turn_id = getattr(args[0], "turn_id", None) if args else None
    return turn_id if isinstance(turn_id, str) else None
