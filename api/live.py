"""The session stream: the session's own log and the logs of the turns it announces, followed
together as one `text/event-stream` (parley/live.py says what it carries and what its cursor
means; store/live.py is the session's log).

It is the turn stream's machinery, not a second one: the same hub and doorbells (one per log
it follows, all waking one event), the same reads of a turn's log (store/events.py
`read_log`), the same response with its send timeout and its `retry:` ending when the
database goes (api/streaming.py), the same per-user leases. A doorbell that brings a turn's
next events is sent without a read, as on the turn stream; the session's doorbell brings none,
so its ring reads the session's log, which only posts, retries and deletions write.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from pydantic import BaseModel
from sse_starlette import ServerSentEvent

from parley.api.metrics import EVENTS_SENT
from parley.api.streaming import LISTENING_POLL_S, POLL_INTERVAL_S, READ_LIMIT, Doorbell, EventHub
from parley.contracts import TERMINAL_EVENTS, TERMINAL_TURN_STATES
from parley.live import (
    READY,
    SESSION_EVENT_DATA,
    ReadyData,
    SessionCursor,
    SessionEventType,
    SessionMessageData,
    TurnFrameData,
)
from parley.store import event_log
from parley.store import live as store_live
from parley.store.db import Database, Db, connect
from parley.store.events import StoredEvent
from parley.wire import MessageView

_ENDED = sorted(state.value for state in TERMINAL_TURN_STATES)


@dataclass
class _Place:
    """Where the stream is: the frame ids it hands out are this, as it stands after each."""

    session_event_id: int
    turns: dict[str, int] = field(default_factory=dict)  # followed turn -> last event sent

    def cursor(self) -> str:
        return str(SessionCursor(self.session_event_id, tuple(self.turns.items())))


class SessionStream:
    """One client's session stream; `batches()` yields its frames as they become known."""

    def __init__(
        self, *, hub: EventHub, sessions: Database, session_id: str, cursor: SessionCursor | None
    ) -> None:
        self._hub = hub
        self._sessions = sessions
        self._session_id = session_id
        self._cursor = cursor
        self._rung = asyncio.Event()
        self._bells: dict[str, Doorbell] = {}
        self._place = _Place(0)

    async def batches(self) -> AsyncIterator[list[ServerSentEvent]]:
        """The frames in the batches they became known together; the first is `ready`."""
        with self._hub.subscribe(self._session_id, self._rung) as session_bell:
            try:
                async for batch in self._follow(session_bell):
                    yield batch
            finally:
                for key, bell in self._bells.items():
                    self._hub.unsubscribe(key, bell)

    async def _follow(self, session_bell: Doorbell) -> AsyncIterator[list[ServerSentEvent]]:
        place = self._place
        async with connect(self._sessions) as db:
            await self._begin(db)
        ready = ReadyData(session_id=self._session_id, turns=list(place.turns))
        first = [self._frame(READY, ready)]
        read_all = True  # at the start, after a poll interval, while a read comes back full
        while True:
            self._rung.clear()  # before looking, so a ring during the reads is kept
            read_session = read_all or session_bell.take(0) is None
            async with connect(self._sessions) as db:
                frames, more, deleted = await self._read(db, read_session, read_all)
            if first or frames:
                yield first + frames
                first = []
            if deleted:
                return
            read_all = more
            if more:
                continue
            poll_s = LISTENING_POLL_S if self._hub.listening.is_set() else POLL_INTERVAL_S
            try:
                async with asyncio.timeout(poll_s):
                    await self._rung.wait()
            except TimeoutError:
                read_all = True

    async def _begin(self, db: Db) -> None:
        """Where to start: the cursor's place (its turns checked as this session's), or the
        session as it stands, its open turns from their first event."""
        start = self._cursor
        if start is not None:
            named = [turn_id for turn_id, _ in start.turns]
            found = await store_live.resume_start(db, session_id=self._session_id, turn_ids=named)
            own = set(found.own_turns)
            start = SessionCursor(
                start.session_event_id, tuple((t, e) for t, e in start.turns if t in own)
            )
            # A session's counter only grows: a cursor ahead of it is none of this session's,
            # read as no cursor (were it kept, the events up to it would be skipped).
            if start.session_event_id > found.last_event_id:
                start = None
        if start is None:
            start = await cursor_now(db, session_id=self._session_id)
        self._place.session_event_id = start.session_event_id
        for turn_id, after in start.turns:
            self._follow_turn(turn_id, after)

    def _follow_turn(self, turn_id: str, after: int) -> None:
        self._place.turns[turn_id] = after
        self._bells[turn_id] = self._hub.add(turn_id, self._rung)

    def _drop_turn(self, turn_id: str) -> None:
        del self._place.turns[turn_id]
        self._hub.unsubscribe(turn_id, self._bells.pop(turn_id))

    async def _read(
        self, db: Db, read_session: bool, read_all: bool
    ) -> tuple[list[ServerSentEvent], bool, bool]:
        """The frames that are new: the session's events (when its doorbell rang), then each
        followed turn's (what its doorbell brought, or its log); whether a read came back full
        (read again at once), and whether the session was deleted (the stream ends)."""
        frames: list[ServerSentEvent] = []
        more, fresh = False, set()
        deleted: store_live.SessionEventRow | None = None
        if read_session:
            rows = await store_live.read_after(
                db,
                session_id=self._session_id,
                after=self._place.session_event_id,
                limit=READ_LIMIT,
            )
            more = len(rows) >= READ_LIMIT
            for row in rows:
                if row.type == SessionEventType.session_deleted:
                    deleted = row  # sent last: the turns' last events go first
                    break
                self._place.session_event_id = row.id
                frames.append(self._frame(row.type, _payload(row)))
                if row.turn_id is not None and row.turn_id not in self._place.turns:
                    self._follow_turn(row.turn_id, 0)
                    fresh.add(row.turn_id)
        for turn_id in list(self._place.turns):
            after = self._place.turns[turn_id]
            events = self._bells[turn_id].take(after)
            ended = False
            if events is None or read_all or turn_id in fresh:
                read = await event_log.read_log(db, turn_id=turn_id, after=after, limit=READ_LIMIT)
                events, ended = read.events, read.ended
                more = more or len(events) >= READ_LIMIT
            for event in events:
                self._place.turns[turn_id] = event.id
                frames.append(self._turn_frame(turn_id, event))
                if event.type in TERMINAL_EVENTS:
                    ended = True
                    break
            if ended:
                self._drop_turn(turn_id)
        if deleted is not None:
            self._place.session_event_id = deleted.id
            frames.append(self._frame(deleted.type, _payload(deleted)))
        if frames:
            EVENTS_SENT.inc(len(frames))
        return frames, more and deleted is None, deleted is not None

    def _frame(self, type_: str, data: BaseModel) -> ServerSentEvent:
        payload = data.model_dump_json()
        return ServerSentEvent(id=self._place.cursor(), event=type_, data=payload)

    def _turn_frame(self, turn_id: str, event: StoredEvent) -> ServerSentEvent:
        data = TurnFrameData(turn_id=turn_id, id=event.id, data=event.data)
        return ServerSentEvent(
            id=self._place.cursor(),
            event=event.type,
            data=json.dumps(data.model_dump(mode="json"), separators=(",", ":")),
        )


async def cursor_now(db: Db, *, session_id: str) -> SessionCursor:
    """The session stream's cursor as `db`'s snapshot sees the session: its last event, and
    its turns that have not ended from their first event (a turn's answer is in no transcript
    until it ends). A transcript read gives it from the snapshot of its messages
    (api/routes/sessions.py), so a stream resumed from it sends what came after the read."""
    start = await store_live.live_start(db, session_id=session_id, ended=_ENDED)
    return SessionCursor(start.last_event_id, tuple((turn_id, 0) for turn_id in start.open_turns))


def _payload(row: store_live.SessionEventRow) -> BaseModel:
    """A session event's payload: a message as the session holds it now (a forgotten one with
    empty text), anything else as stored."""
    if row.type != SessionEventType.message:
        return SESSION_EVENT_DATA[row.type].model_validate(row.data)
    message = MessageView.model_validate(
        {
            "id": row.message_id,
            "seq": row.seq or 0,
            "role": row.role or "user",
            "author_name": row.author_name,
            "turn_id": row.message_turn_id,
            "status": row.status or "complete",
            "text": row.text or "",
            "created_at": row.message_created_at or row.created_at,
        }
    )
    return SessionMessageData(message=message)
