"""The session stream's contract: every tab and device of a session kept live by one stream
(`GET /v1/sessions/{sid}/stream`, api/live.py), and its resume cursor.

What the stream carries comes from two logs, neither copied into the other:

- the session's own events (`session_events`, store/live.py), numbered per session under the
  session row's lock: a user message posted (or queued), a turn started without a new
  message (a retry), the session deleted. A new kind is one `SessionEventType` here and one
  payload model in `SESSION_EVENT_DATA`; a writer adds it with `store.live.announce` in its
  own transaction (a branch switch, say);
- the event log of each turn the session's events announce (`turn_events`, store/events.py),
  sent with its own ids and payloads, wrapped with the turn's id (`TurnFrameData`). Whatever a
  turn's log gains (a steer, a card's expiry warning) reaches the session stream with it.

So a plain turn writes nothing more than before: its events are numbered by its own row, as
they always were, and the session row is written by the statements that write it already (a
post's, a queue's, a retry's). The price is the cursor: a position in each log that still
has something to come, not one number.

The cursor (the SSE `id`, sent back as `Last-Event-ID`) is `S` or `S.T.E` or `S.T.E.T.E`...:
`S` the last session event sent, then for each turn still followed (announced, not yet ended)
its id `T` and the last of its events sent `E`. Every turn announced at or before `S` and not
named has ended and was sent whole. A stream with no cursor starts at the session's last event
and follows its turns that have not ended from their first event.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Any, Literal, Self, Union

from pydantic import BaseModel, Field, RootModel, create_model

from parley.handoffs import HandoffStatusData
from parley.wire import EVENT_DATA, JsonText, MessageView, RetryFrame


class SessionEventType(StrEnum):
    """The session's own events, as stored and as sent."""

    # A user message joined the session (or was queued behind the running turn: seq 0); it
    # announces its turn.
    message = "message"
    # A turn started without a new message (a retry), announced.
    turn = "turn"
    # The session shows another version of the conversation (a switch, an edit, a
    # regenerate: docs/api.md, Versions); a client reads its messages again.
    branch_switched = "branch_switched"
    # A hand-off to a person moved (opened, claimed, unclaimed, ended: parley/handoffs.py);
    # while one is open, the conversation's messages (the customer's, the person's replies,
    # the support team's notices) are `message` frames with no turn.
    handoff = "handoff"
    # The session was deleted; the stream ends after it.
    session_deleted = "session_deleted"


# Sent, never stored: the first frame of every connection, whose id is the cursor to resume
# from even when nothing else has happened yet.
READY = "ready"


class SessionMessageData(BaseModel):
    """`message`: the user's message as the session holds it when the frame is sent (a
    forgotten message has empty text); while a person holds the session, any message of the
    conversation (the person's reply: `assistant`, with `author_name`)."""

    message: MessageView


class SessionTurnData(BaseModel):
    """`turn`: a turn started for a message already in the session."""

    turn_id: str
    retry_of: str | None = None


class BranchSwitchedData(BaseModel):
    """`branch_switched`: the session's active branch now."""

    branch: int


class SessionDeletedData(BaseModel):
    """`session_deleted`: nothing follows."""


class ReadyData(BaseModel):
    """`ready`: the stream is live; `turns` are the turns it follows (their events come
    after the cursor's position in each)."""

    session_id: str
    turns: list[str]


class TurnFrameData(BaseModel):
    """A turn's event on the session stream: `id` and `data` as the turn's own stream sends
    them, and the turn they belong to."""

    turn_id: str
    id: int
    data: dict[str, Any]


SESSION_EVENT_DATA: dict[str, type[BaseModel]] = {
    SessionEventType.message: SessionMessageData,
    SessionEventType.turn: SessionTurnData,
    SessionEventType.branch_switched: BranchSwitchedData,
    SessionEventType.handoff: HandoffStatusData,
    SessionEventType.session_deleted: SessionDeletedData,
}


# --- the cursor ---------------------------------------------------------------------------

# A session has at most two turns open at once (the running one, the one queued behind it);
# the cursor's bound leaves room for later kinds and keeps parsing the header cheap.
MAX_FOLLOWED = 16
_ID = r"[0-9]{1,18}"
_TURN = r"[A-Za-z0-9_]{1,40}"
CURSOR_PATTERN = rf"^{_ID}(\.{_TURN}\.{_ID}){{0,{MAX_FOLLOWED}}}$"
_CURSOR = re.compile(CURSOR_PATTERN)


@dataclass(frozen=True)
class SessionCursor:
    """Where a client of the session stream is: the last session event it has, and its
    place in each turn it follows."""

    session_event_id: int
    turns: tuple[tuple[str, int], ...] = ()

    @classmethod
    def parse(cls, text: str) -> Self:
        """The cursor of a `Last-Event-ID`; ValueError when it is not one."""
        if not _CURSOR.fullmatch(text):
            raise ValueError(f"not a session stream id: {text!r}")
        head, *rest = text.split(".")
        turns = tuple((rest[i], int(rest[i + 1])) for i in range(0, len(rest), 2))
        return cls(int(head), turns)

    def __str__(self) -> str:
        return ".".join([str(self.session_event_id), *(f"{t}.{e}" for t, e in self.turns)])


# --- the frames, for the OpenAPI document -------------------------------------------------


def _frame(event: str, data: type[BaseModel], prefix: str = "") -> type[BaseModel]:
    name = prefix + "".join(part.title() for part in event.split("_")) + "SessionFrame"
    kind: Any = Literal[event]  # a literal built at run time, once per frame type
    return create_model(
        name,
        id=(str, Field(pattern=CURSOR_PATTERN, description="the session stream's cursor")),
        event=(kind, ...),
        data=(Annotated[str, JsonText(data)], ...),
    )


_FRAMES: Any = Union[  # noqa: UP007
    (
        RetryFrame,
        _frame(READY, ReadyData),
        *(_frame(event, data) for event, data in SESSION_EVENT_DATA.items()),
        *(_frame(event, TurnFrameData, "Turn") for event in EVENT_DATA),
    )
]


class SessionStreamEvent(RootModel[Any]):
    """One frame of the session stream (`text/event-stream`): a session event, or a turn's
    event with its turn's id."""

    root: _FRAMES
