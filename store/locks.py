"""The advisory locks: what orders writers that share no row to lock.

Each is a named key's `hashtext`, taken with `pg_advisory_xact_lock` and held to the end of
the transaction that takes it (a statement in autocommit holds it for itself alone):

- a user's turns (`user_turns`): two posts of one user cannot both see room for one more
  running turn (store/limits.py, and the POST's first read, store/posting.py);
- a user's open streams (`user_streams`): two streams of one user cannot both take the last
  lease (store/limits.py);
- a session's summary (`session_summary`): one summary writer of a session at a time, without
  locking the session's row, which the turns keep writing (store/summaries.py);
- the outbox sweep (`OUTBOX_SWEEP`): one worker sweeps at a time; a worker whose tick finds
  it held skips that tick (dispatch/outbox.py), so N workers do not run N sweeps;
- a new turn's start (`turn_start`): of the workers that hear its post's ring, the one that
  takes it starts the turn, holding it through the start (store/outbox.py `claim_start`);
  the others skip it, and a dead claimer's connection lets it go for the sweep;
- the schema (`SCHEMA_MIGRATIONS`): one `parley migrate` upgrades at a time, so every pod of
  a deployment may run it on start; the others wait, then find nothing to do
  (store/migrations/env.py).

A statement that takes a lock beside other work composes `TAKE` (or `TRY_TAKE`; its
parameter is `lock_key`); one that only takes it runs `hold`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from parley.store.db import Database, Db
from parley.store.identity import Identity

# The lock as a select-list expression (its value is void): the statement that selects it
# holds it before it reads the columns beside it.
TAKE = "pg_advisory_xact_lock(hashtext(%(lock_key)s))"


def user_turns(owner: Identity) -> str:
    return f"turns:{owner.tenant_id}/{owner.user_id}"


def user_streams(owner: Identity) -> str:
    return f"streams:{owner.tenant_id}/{owner.user_id}"


def session_summary(session_id: str) -> str:
    return f"summary:{session_id}"


SCHEMA_MIGRATIONS = "schema:migrations"
OUTBOX_SWEEP = "outbox:sweep"


def turn_start(turn_id: str) -> str:
    """A new turn's start, claimed by the one worker that starts it (dispatch/outbox.py)."""
    return f"start:{turn_id}"


async def hold(db: Db, key: str) -> None:
    """Take the lock named `key` for the rest of the caller's transaction."""
    await db.run(_HOLD, {"lock_key": key})


@asynccontextmanager
async def if_free(database: Database, key: str) -> AsyncIterator[bool]:
    """Hold the lock named `key` for the block if nobody holds it (yields True), else hold
    nothing (False). It lives in a transaction of its own that the block leaves open and
    that ends when the block does (committed: a `ROLLBACK` would also drop the pooled
    connection's prepared statements; the block writes nothing through it): a worker that
    dies mid-block drops its connection and with it the lock, so no one waits on a dead
    holder."""
    async with database() as db:
        yield bool(await db.value(_TRY_HOLD, {"lock_key": key}))
        await db.commit()


# Held if free, to the end of the transaction: a select-list expression, true when taken.
TRY_TAKE = "pg_try_advisory_xact_lock(hashtext(%(lock_key)s))"
_TRY_HOLD = f"SELECT {TRY_TAKE}"
_HOLD = f"SELECT {TAKE}"
# The same, for the migrations' synchronous connection (`exec_driver_sql`).
HOLD_SQL = _HOLD
