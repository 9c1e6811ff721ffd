"""Live event streams: one LISTEN connection per API process wakes every open stream.

The durable log in `turn_events` is the truth; NOTIFY is a doorbell that also brings the
events just committed when they fit (store/events.py). A stream reads the log after its last
id, sends what it finds, and sleeps until the doorbell rings for its turn (or a poll interval
passes: short while the listener is down and notifications can be lost, long while it is up).
When the doorbell brings exactly the next events, the stream sends them without a read; a
gap, or a ring without events, sends it back to the log. So any API process can serve any
turn, and a reconnect with `Last-Event-ID` misses nothing.

A stream whose read finds the database gone ends with a `retry:` frame instead of breaking
off (api/sse.py): the client reconnects with its last event id after that pause, is answered
503 with `Retry-After` until the database is back (api/errors.py), and then misses nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections import defaultdict
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Coroutine,
    Iterator,
)
from datetime import timedelta
from typing import Any

from pydantic import ValidationError
from sse_starlette import ServerSentEvent

from parley.api.metrics import EVENTS_SENT
from parley.contracts import TERMINAL_EVENTS, EventType
from parley.errors import NotFound, RateLimited
from parley.store import event_log, limits, viewers
from parley.store.db import Database, Db, connect
from parley.store.events import StoredEvent, parse_notification, parse_ring
from parley.store.identity import Identity
from parley.store.listener import listen_for_events
from parley.store.sessions import SESSION_NOT_FOUND, TURN_NOT_FOUND
from parley.wire import event_data

log = logging.getLogger(__name__)

# A stream reads the log when its doorbell has been quiet this long. While the LISTEN
# connection is up no notification can be lost (and its reconnect rings every doorbell), so
# the poll is only a safety net then; while it is down, polls are how streams move on.
POLL_INTERVAL_S = 1.0
LISTENING_POLL_S = 15.0
READ_LIMIT = 500


class Doorbell:
    """One open stream's wake-up, holding the events the doorbell brought since it last looked."""

    def __init__(self, rung: asyncio.Event | None = None) -> None:
        # Shared by the doorbells of one stream that follows several logs (api/live.py).
        self._rung = rung if rung is not None else asyncio.Event()
        self._brought: list[StoredEvent] = []
        self._unknown = False  # rung without events: only the log knows what is new

    def ring(self, events: list[StoredEvent]) -> None:
        if events:
            self._brought.extend(events)
        else:
            self._unknown = True
        self._rung.set()

    def clear(self) -> None:
        self._rung.clear()

    async def wait(self) -> None:
        await self._rung.wait()

    def take(self, after: int) -> list[StoredEvent] | None:
        """The brought events after `after` if they follow it without a gap (none brought:
        an empty list), or None when the log must be read."""
        brought, unknown = self._brought, self._unknown
        self._brought, self._unknown = [], False
        if unknown:
            return None
        fresh = [event for event in brought if event.id > after]
        for offset, event in enumerate(fresh, start=1):
            if event.id != after + offset:
                return None
        return fresh


class EventHub:
    def __init__(self, conninfo: str) -> None:
        self._conninfo = conninfo
        self._waiters: dict[str, set[Doorbell]] = defaultdict(set)
        self._task: asyncio.Task[None] | None = None
        self.listening = asyncio.Event()  # set while the LISTEN connection is up
        self.listener_pid: int | None = None  # that connection's server process, once up

    async def start(self) -> None:
        self._task = asyncio.create_task(self._listen_forever())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    @contextlib.contextmanager
    def subscribe(self, key: str, rung: asyncio.Event | None = None) -> Iterator[Doorbell]:
        """A doorbell for the log of `key` (a turn's id, or a session's: api/live.py), waking
        `rung` when given."""
        event = Doorbell(rung)
        self._waiters[key].add(event)
        try:
            yield event
        finally:
            self.unsubscribe(key, event)

    def unsubscribe(self, key: str, doorbell: Doorbell) -> None:
        waiters = self._waiters.get(key)
        if waiters is not None:
            waiters.discard(doorbell)
            if not waiters:
                del self._waiters[key]

    def add(self, key: str, rung: asyncio.Event) -> Doorbell:
        """`subscribe` for a stream that adds and drops logs as it goes: the caller
        `unsubscribe`s it."""
        doorbell = Doorbell(rung)
        self._waiters[key].add(doorbell)
        return doorbell

    def _ring(self, payload: str) -> None:
        """Wake this process's streams of each turn (or session) the payload names (a
        worker's batched ring names many: store/events.py `ring_turns`)."""
        for line in parse_ring(payload):
            self._ring_one(line)

    def _ring_one(self, payload: str) -> None:
        """Wake this process's streams of one doorbell's turn (or session); parse the events
        only if any."""
        waiters = self._waiters.get(payload.partition(":")[0])
        if not waiters:
            return
        try:
            _, events = parse_notification(payload)
        except (ValueError, KeyError, TypeError):
            log.warning("unreadable event notification; streams read the log", exc_info=True)
            events = []
        for doorbell in waiters:
            doorbell.ring(events)

    async def _listen_forever(self) -> None:
        while True:
            try:
                await listen_for_events(
                    self._conninfo, on_listening=self._listening, on_payload=self._ring
                )
            except asyncio.CancelledError:
                raise
            except Exception:
                self.listening.clear()
                self.listener_pid = None
                log.warning("event listener lost its connection; reconnecting", exc_info=True)
                await asyncio.sleep(1.0)

    def _listening(self, pid: int) -> None:
        self.listener_pid = pid
        self.listening.set()
        # Anything committed while we were not listening is picked up by polls.
        for waiters in list(self._waiters.values()):
            for doorbell in waiters:
                doorbell.ring([])


class Viewer:
    """A stream that counts as a viewer of its turn (store/viewers.py): it attaches in the
    transaction of its first read, and `attached` says whether that committed (only then
    must its end detach it)."""

    def __init__(self) -> None:
        self.attached = False


async def turn_event_stream(
    *,
    hub: EventHub,
    sessions: Database,
    turn_id: str,
    after: int,
    viewer: Viewer | None = None,
) -> AsyncIterator[ServerSentEvent]:
    """Replay the log after `after`, then follow it live until a terminal event."""
    async for batch in turn_event_batches(
        hub=hub, sessions=sessions, turn_id=turn_id, after=after, viewer=viewer
    ):
        for event in batch:
            yield event


async def turn_event_batches(
    *,
    hub: EventHub,
    sessions: Database,
    turn_id: str,
    after: int,
    viewer: Viewer | None = None,
) -> AsyncIterator[list[ServerSentEvent]]:
    """The turn's frames in the batches they became known together (one log read, or one
    doorbell), so a caller can write each batch at once. The first batch comes after the
    first read even when it is empty; later batches are never empty."""
    async for batch in stored_event_batches(
        hub=hub, sessions=sessions, turn_id=turn_id, after=after, viewer=viewer
    ):
        yield _frames(batch)


async def stored_event_batches(
    *,
    hub: EventHub,
    sessions: Database,
    turn_id: str,
    after: int,
    viewer: Viewer | None = None,
) -> AsyncIterator[list[StoredEvent]]:
    """The turn's stored events after `after`, in the batches they became known together,
    up to the first terminal event or until the turn comes to rest awaiting the user (its
    stream resumes once the user has answered). Every stream of a turn reads through here:
    SSE (`turn_event_batches`) and the AI SDK chat (api/routes/ai_sdk.py). The first batch
    comes after the first read even when it is empty; later batches are never empty."""
    with hub.subscribe(turn_id) as doorbell:
        read_log = True  # at the start, after a poll interval, while a read comes back full
        first = True
        while True:
            doorbell.clear()  # cleared before looking, so a ring during a read is kept
            events = doorbell.take(after)
            ended = False
            if events is None or read_log:
                attach = viewer is not None and not viewer.attached
                async with connect(sessions) as conn:  # autocommit: the attach commits
                    read = await event_log.read_log(
                        conn, turn_id=turn_id, after=after, limit=READ_LIMIT, attach=attach
                    )
                if viewer is not None and attach:
                    viewer.attached = True
                events, ended = read.events, read.ended
                read_log = len(events) >= READ_LIMIT
            batch, done = _until_end(events)
            if batch or first:
                first = False
                yield batch
            if events:
                after = events[-1].id
            if done or ended:
                return  # a terminal event, the turn rests, or resumed past a finished turn
            if events or read_log:
                continue
            poll_s = LISTENING_POLL_S if hub.listening.is_set() else POLL_INTERVAL_S
            try:
                async with asyncio.timeout(poll_s):  # no task of its own, as `wait_for` makes
                    await doorbell.wait()
            except TimeoutError:
                read_log = True


def _until_end(events: list[StoredEvent]) -> tuple[list[StoredEvent], bool]:
    """`events` up to the first terminal one, and whether the stream ends with them: at a
    terminal event, or when the turn comes to rest awaiting the user."""
    for at, event in enumerate(events):
        if event.type in TERMINAL_EVENTS:
            return events[: at + 1], True
    resting = (EventType.confirmation_required, EventType.interaction)
    return events, bool(events) and events[-1].type in resting


def _frames(events: list[StoredEvent]) -> list[ServerSentEvent]:
    """One SSE frame per event, each checked against its contract model."""
    frames: list[ServerSentEvent] = []
    for event in events:
        _check_shape(event.id, event.type, event.data)
        frames.append(
            ServerSentEvent(
                id=str(event.id),
                event=event.type,
                data=json.dumps(event.data, separators=(",", ":")),
            )
        )
    if frames:
        EVENTS_SENT.inc(len(frames))  # once a batch: the counter takes a lock each time
    return frames


def _check_shape(event_id: int, type_: str, data: dict[str, Any]) -> None:
    """Log an event whose payload breaks its `parley.wire` model. The stored JSON is still
    sent as written: the log is the truth, and a client may know better than this process."""
    try:
        event_data(type_, data)
    except (ValidationError, KeyError):
        log.warning("event %s (%s) does not match the contract", event_id, type_, exc_info=True)


class StreamRegistry:
    """This process's open streams: the per-user limit (leases in the store, shared by every
    API process), viewer counts in the store, and the cancellation of turns nobody came back
    to watch.

    Release never awaits: a stream ends inside a cancelled task when its client hangs up, so
    the bookkeeping runs in a task of its own. One task renews this process's leases.
    """

    def __init__(
        self,
        *,
        sessions: Database,
        cancel_turn: Callable[[str], Awaitable[None]],
        max_per_user: int,
        grace_s: float,
        lease_s: float = 60.0,
    ) -> None:
        self._sessions = sessions
        self._cancel_turn = cancel_turn
        self._max_per_user = max_per_user
        self._grace = timedelta(seconds=grace_s)
        self._lease_s = lease_s
        self._leases: set[str] = set()
        self._renewer: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def reserve(self, db: Db, owner: Identity, session_id: str, turn_id: str | None) -> str:
        """A lease on one of the user's open streams of the owner's turn (None: of the
        session, api/live.py; 404 when it is not theirs), or 429 at the limit; committed in
        the caller's session (the request's own, which has just authenticated the caller)."""
        try:
            lease = await limits.take_stream_lease(
                db,
                owner=owner,
                limit=self._max_per_user,
                lease_s=self._lease_s,
                turn=(session_id, turn_id),
            )
        except LookupError:
            raise NotFound(TURN_NOT_FOUND if turn_id else SESSION_NOT_FOUND) from None
        return await self._held(db, lease)

    async def reserve_case(self, db: Db, owner: Identity) -> str:
        """A lease on one of the user's open streams for a hand-off's stream, whose case the
        caller has found theirs to read (api/routes/handoffs.py); 429 at the limit."""
        lease = await limits.take_case_stream_lease(
            db, owner=owner, limit=self._max_per_user, lease_s=self._lease_s
        )
        return await self._held(db, lease)

    async def _held(self, db: Db, lease: str | None) -> str:
        """The lease committed and renewed from now on, or 429 when there was none to take."""
        await db.commit()
        if lease is None:
            raise RateLimited(
                f"at most {self._max_per_user} open event streams per user", retry_after_s=1
            )
        self._leases.add(lease)
        if self._renewer is None or self._renewer.done():
            self._renewer = asyncio.create_task(self._renew_forever())
        return lease

    async def _renew_forever(self) -> None:
        while self._leases:
            await asyncio.sleep(self._lease_s / 3)
            try:
                async with self._sessions() as db:
                    await limits.renew_stream_leases(
                        db, lease_ids=sorted(self._leases), lease_s=self._lease_s
                    )
                    await db.commit()
            except Exception:
                log.warning("could not renew stream leases", exc_info=True)

    def release(
        self, lease: str, turn_id: str | None, *, hung_up: bool, grace_s: float | None = None
    ) -> None:
        """`grace_s`: how long a hung-up turn waits for a viewer before it is cancelled, when
        not the registry's own (the AI SDK chat's Stop is a hang-up: api/routes/ai_sdk.py)."""
        self._leases.discard(lease)
        grace = self._grace if grace_s is None else timedelta(seconds=grace_s)
        self._spawn(self._release(lease, turn_id, watch=hung_up, grace=grace))

    async def _drop_leases(self, leases: list[str]) -> None:
        try:
            async with self._sessions() as db:
                await limits.drop_stream_leases(db, lease_ids=leases)
                await db.commit()
        except Exception:
            # They lapse by themselves once they are no longer renewed.
            log.warning("could not drop stream leases %s", leases, exc_info=True)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _release(
        self, lease: str, turn_id: str | None, *, watch: bool, grace: timedelta
    ) -> None:
        """Drop the lease and the viewer in one transaction; then, if the client hung up,
        cancel the turn should nobody come back to it within the grace period."""
        try:
            async with connect(self._sessions) as conn:  # one statement, autocommit
                await limits.end_stream(conn, lease_id=lease, turn_id=turn_id)
        except asyncio.CancelledError:
            raise
        except Exception:
            # A lease lapses by itself once it is no longer renewed.
            log.warning("could not release the stream of turn %s", turn_id, exc_info=True)
            return
        if turn_id is not None and watch:
            await self._watch(turn_id, grace)

    async def _watch(self, turn_id: str, grace: timedelta) -> None:
        try:
            await asyncio.sleep(grace.total_seconds())
            async with self._sessions() as db:
                if await viewers.abandoned(db, turn_id=turn_id, grace=grace):
                    log.info("nobody reattached to turn %s; cancelling it", turn_id)
                    await self._cancel_turn(turn_id)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.warning("stream bookkeeping for turn %s failed", turn_id, exc_info=True)

    async def close(self) -> None:
        if self._renewer is not None:
            self._renewer.cancel()
        if self._leases:  # this process's streams end with it
            await self._drop_leases(sorted(self._leases))
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
