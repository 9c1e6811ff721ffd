"""The start outbox's queries: a turn row whose workflow start was never confirmed, and a
turn row still open whose workflow may have closed without ending it."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from parley.contracts import TERMINAL_TURN_STATES, TurnState
from parley.store import locks, turns
from parley.store.db import Db
from parley.store.queue import Startable
from parley.wire import ErrorData


async def turn_number(db: Db, *, turn_id: str) -> int:
    """The turn's place in its session (1 for the first; a retry is a turn of its own), for
    the workflow's summary in the Temporal UI."""
    return int(await db.value(_TURN_NUMBER, {"turn_id": turn_id}) or 0)


_TURN_NUMBER = """
    SELECT count(*) FROM turns AS t JOIN turns AS this ON this.id = %(turn_id)s
    WHERE t.session_id = this.session_id AND t.created_at <= this.created_at
"""


@dataclass(frozen=True)
class Claimed:
    """A turn this worker claimed to start (`claim_start`), with what its start needs."""

    id: str
    session_id: str
    tenant_id: str
    number: int  # its place in the session (`turn_number`)
    paused: bool  # its tenant's switch (store/tenants.py), read with it


async def claim_start(db: Db, *, turn_id: str) -> Claimed | None:
    """Claim the start of a turn whose post rang the outbox: the turn's start lock
    (store/locks.py `turn_start`), taken if free and held by `db`'s transaction until the
    caller marks the start and commits, with the turn, when it still waits to start, in one
    statement. None: another worker holds it, or the turn no longer waits (started, ended)."""
    params = {
        "lock_key": locks.turn_start(turn_id),
        "turn_id": turn_id,
        "received": TurnState.received.value,
    }
    async with db.together():  # with the claim's `BEGIN`: one round trip
        sent = await db.send(_CLAIM_START, params, _Claim)
    claimed = await sent.row()
    if claimed is None or not claimed.mine or claimed.id is None:
        return None
    assert claimed.session_id is not None and claimed.tenant_id is not None
    number, paused = int(claimed.number or 0), bool(claimed.paused)
    return Claimed(claimed.id, claimed.session_id, claimed.tenant_id, number, paused)


@dataclass(frozen=True)
class _Claim:
    mine: bool
    id: str | None
    session_id: str | None
    tenant_id: str | None
    number: int | None
    paused: bool | None


# The lock first; the turn read beside it (a turn that another worker started just before is
# found started; one started between this statement's snapshot and the lock is started
# again, which attaches to its workflow).
_CLAIM_START = f"""
    SELECT {locks.TRY_TAKE} AS mine, t.id, t.session_id, t.tenant_id,
        (SELECT count(*) FROM turns AS o
            WHERE o.session_id = t.session_id AND o.created_at <= t.created_at) AS number,
        (SELECT paused FROM tenants WHERE id = t.tenant_id) AS paused
    FROM (SELECT 1) AS one
    LEFT JOIN turns AS t ON t.id = %(turn_id)s AND t.state = %(received)s
        AND t.workflow_started_at IS NULL
"""


async def mark_workflow_started(db: Db, *, turn_id: str) -> None:
    await db.run(_MARK_STARTED, {"turn_id": turn_id, "now": datetime.now(UTC)})


# Plain SQL on psycopg's own connection: every turn the API starts runs it.
_MARK_STARTED = (
    "UPDATE turns SET workflow_started_at = %(now)s"
    " WHERE id = %(turn_id)s AND workflow_started_at IS NULL"
)


async def unstarted_turns(db: Db, *, older_than: timedelta, limit: int = 50) -> list[Startable]:
    """Turns committed by the API whose workflow start was never confirmed. Only turns still
    in `received`, or in `building_context` (the claiming worker began the first build beside
    a start it did not live to make: activities/early_build.py): a turn that ended (a cancel
    raced the start) is never started."""
    params = {
        "cutoff": datetime.now(UTC) - older_than,
        "waiting": [TurnState.received.value, TurnState.building_context.value],
        "limit": limit,
    }
    return await db.rows(_UNSTARTED, params, Startable)


_UNSTARTED = """
    SELECT id, session_id, tenant_id FROM turns
    WHERE workflow_started_at IS NULL AND created_at < %(cutoff)s AND state = ANY(%(waiting)s)
    ORDER BY created_at LIMIT %(limit)s
"""


async def quiet_open_turns(db: Db, *, quiet_for: timedelta, limit: int = 50) -> list[Startable]:
    """Started turns that have not ended and have written nothing for `quiet_for`: the sweep
    asks Temporal whether their workflow still runs."""
    params = {"cutoff": datetime.now(UTC) - quiet_for, "limit": limit}
    return await db.rows(_QUIET_OPEN, params, Startable)


# `NOT IN` a literal list, as the partial index `ix_turns_open` spells it, so the planner
# can use the index (a parameter would hide the list from it).
_ENDED = ", ".join(sorted(f"'{state.value}'" for state in TERMINAL_TURN_STATES))
_QUIET_OPEN = f"""
    SELECT id, session_id, tenant_id FROM turns
    WHERE state NOT IN ({_ENDED})
        AND workflow_started_at IS NOT NULL AND updated_at < %(cutoff)s
    ORDER BY updated_at LIMIT %(limit)s
"""


async def end_unstarted_turn(
    db: Db, *, turn_id: str, state: TurnState, error: ErrorData | None = None
) -> None:
    """End a turn whose workflow will not run it (never started, or closed), and mark it
    started, in the caller's one transaction: the outbox can never start it afterwards."""
    await turns.end_unfinished_turn(db, turn_id=turn_id, state=state, error=error)
    await mark_workflow_started(db, turn_id=turn_id)


# What a worker sends to start a posted turn (`claim_start`, `mark_workflow_started`): the
# turn's start, apart from its steps (tests/support/counting.py counts them apart).
START_STATEMENTS = (_CLAIM_START, _MARK_STARTED)
