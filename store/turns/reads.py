"""A turn as its steps read it, on a `Db` (store/db.py): `TurnRow` (what decides whether a
step may run) and `TurnFacts` (whom the turn serves and what it answers). Read-only: a
turn's writes are `parley.store.turns`' and its parts'."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, ClassVar

from parley.contracts import TurnState
from parley.store.db import Db


@dataclass(frozen=True)
class TurnRow:
    """A turn as a step reads it: what decides whether the step may run."""

    id: str
    session_id: str
    state: str
    cancel_requested_at: datetime | None
    assistant_message_id: str | None
    # The turn this one retries (its unfinished answer gives way to this one's).
    retry_of: str | None

    # The columns, in a statement that reads the turn as `t` (each named `t_<field>`).
    COLUMNS: ClassVar[str] = (
        "t.id AS t_id, t.session_id AS t_session_id, t.state AS t_state,"
        " t.cancel_requested_at AS t_cancel_requested_at,"
        " t.assistant_message_id AS t_assistant_message_id, t.retry_of AS t_retry_of"
    )

    @classmethod
    def from_columns(cls, columns: dict[str, Any]) -> TurnRow:
        """The turn from a row that holds `COLUMNS` among others."""
        return cls(**{k[2:]: v for k, v in columns.items() if k.startswith("t_")})


@dataclass(frozen=True)
class TurnFacts:
    """A turn as the steps after its start read it: whom it serves and what it answers.
    Read-only: a step that moves the turn does so through store/turns/."""

    id: str
    session_id: str
    tenant_id: str
    user_id: str
    user_message_id: str
    user_seq: int
    state: str
    cancel_requested_at: datetime | None
    resolution: dict[str, Any] | None
    # The turn this one retries (its unfinished answer is hidden from this one's window).
    retry_of: str | None

    COLUMNS: ClassVar[str] = (
        "id, session_id, tenant_id, user_id, user_message_id, user_seq, state,"
        " cancel_requested_at, resolution, retry_of"
    )


async def turn_facts(conn: Db, *, turn_id: str, lock: bool = False) -> TurnFacts | None:
    """The turn as it stands now (`lock`: its row locked until the caller's transaction
    ends), or None for an unknown id."""
    return await conn.row(_TURN_FACTS_LOCKED if lock else _TURN_FACTS, {"id": turn_id}, TurnFacts)


_TURN_FACTS = f"SELECT {TurnFacts.COLUMNS} FROM turns WHERE id = %(id)s"
_TURN_FACTS_LOCKED = f"SELECT {TurnFacts.COLUMNS} FROM turns WHERE id = %(id)s FOR UPDATE"


# A statement's `turn` CTE returning the turn's session, its row locked first (then the
# session's, for a seq): the order of every writer of a turn. Composed by the one-statement
# writers of a turn's messages (store/turns/tool_calls.py `store_tool_result`,
# store/turns/attempts.py `record_tool_requests`).
TURN_LOCKED = """turn AS (
        SELECT session_id FROM turns WHERE id = %(turn_id)s FOR UPDATE
    )"""


@dataclass(frozen=True)
class PostedTurn:
    """The turn a post opened, joined or queued, as the API needs it."""

    id: str
    session_id: str
    tenant_id: str
    user_id: str
    state: TurnState
