"""Who is watching a turn, so that a running turn nobody watches any more is cancelled.

A turn's own streams count as its viewers; an open session stream of its session (a lease
that names the session, store/limits.py) watches every turn of it, without counting."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from parley.contracts import TERMINAL_TURN_STATES, TurnState
from parley.store.db import Db

# Plain SQL in psycopg's form, so that a stream's first read of the log can carry it
# (store/events.py) and its end can join it to the drop of its lease (store/limits.py
# `end_stream`); both run on a `Db`.
ATTACH_VIEWER_SQL = (
    "UPDATE turns SET viewers = viewers + 1, detached_at = NULL WHERE id = %(turn_id)s"
)


# One viewer fewer; the last one out stamps when the turn was left alone.
DETACH_VIEWER_SQL = """
    UPDATE turns SET viewers = greatest(viewers - 1, 0),
        detached_at = CASE WHEN viewers <= 1 THEN now() ELSE NULL END
    WHERE id = %(turn_id)s
"""


@dataclass(frozen=True)
class _Watched:
    state: str
    viewers: int
    detached_at: datetime | None
    followed: bool  # a session stream of the turn's session is open


async def abandoned(db: Db, *, turn_id: str, grace: timedelta) -> bool:
    """Nobody has watched this running turn for `grace`. A turn resting for a confirmation
    (or a specialist's question) is not running, so it is never abandoned."""
    turn = await db.row(_WATCHED, {"turn_id": turn_id}, _Watched)
    if turn is None or turn.viewers > 0 or turn.detached_at is None or turn.followed:
        return False
    if turn.state in TERMINAL_TURN_STATES or turn.state in (
        TurnState.awaiting_confirmation,
        TurnState.awaiting_input,
    ):
        return False
    return turn.detached_at <= datetime.now(UTC) - grace + timedelta(milliseconds=50)


_WATCHED = """
    SELECT t.state, t.viewers, t.detached_at, EXISTS (
            SELECT 1 FROM stream_leases AS l
            WHERE l.tenant_id = t.tenant_id AND l.user_id = t.user_id
                AND l.session_id = t.session_id AND l.expires_at > now()
        ) AS followed
    FROM turns AS t WHERE t.id = %(turn_id)s
"""
