"""Abuse limits kept in PostgreSQL, so that every API process counts against the same numbers.

Checked before a posted message may start model work, cheapest first (`admit_turn`), and only
once the request is known to be valid (store/posting.py: an unknown file or a stale view is
refused first, so a bad request costs nothing and is told what is wrong even at a limit):

    paused tenant            403 agent_paused           (read with the count below)
    running turns per user   429 too_many_active_turns  (one indexed count under a user lock)
    posts per minute         429 rate_limited           (user, then tenant; Retry-After)
    messages per UTC day     429 daily_cap_reached      (user, then tenant)

Windowed limits are counters (`usage_counters`), each taken by a conditional upsert (all of a
post's windows in one statement): the row is locked while it is counted, so concurrent posts
in any process never exceed a cap. The count
joins the caller's transaction: a post refused later (409, or a cap after this one) counts
for nothing. A counting error fails open (the post goes through and the error is logged);
pause fails closed, because an error reading the tenant row fails the request.

Open event streams per user are leases (`stream_leases`) that their API process renews; a
process that dies stops renewing, and its leases lapse.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any, TypeVar, cast

from parley.config import Limits
from parley.contracts import TERMINAL_TURN_STATES, TurnState
from parley.errors import AgentPaused, DailyCapReached, RateLimited, TooManyActiveTurns
from parley.ids import new_id
from parley.store import locks
from parley.store.db import Db, Sent, StoreError
from parley.store.identity import Identity
from parley.store.viewers import DETACH_VIEWER_SQL
from parley.tenancy import TenantConfig

log = logging.getLogger(__name__)

T = TypeVar("T")

# States in which a turn does no model work: it waits for its user.
RESTING = (TurnState.awaiting_confirmation, TurnState.awaiting_input)


async def admit_turn(
    db: Db, *, owner: Identity, limits: Limits, locked: bool = False
) -> TenantConfig:
    """Refuse a post of a paused tenant, or one that would go over a limit, counting it
    against the windowed ones. The tenant's configuration, where it sets a limit, overrides
    the deployment's. `locked`: the caller's transaction already holds `locks.user_turns(owner)`
    (taken by an earlier statement of its own, saving this one a round trip). Returns the
    tenant's configuration, as this read found it."""
    if not locked:
        await locks.hold(db, locks.user_turns(owner))
    admitted = await admission(await send_running(db, owner=owner, limits=limits), owner, limits)
    await take_all(db, admitted.takes)
    return admitted.config


@dataclass(frozen=True)
class Admission:
    """A post the switch and the running-turns limit let through: the tenant's configuration
    and the windowed counters the post is still to take (`take_all`, `take_all_then`)."""

    config: TenantConfig
    takes: list[Take]


async def admission(read: Sent[_RunningAndTenant], owner: Identity, limits: Limits) -> Admission:
    """From the read `send_running` sent: refuse a paused tenant's post, or one over the
    user's running turns; else what the post is to count."""
    row = await read.row()
    assert row is not None  # a select list without FROM: always one row
    if row.paused:
        raise AgentPaused("the assistant is paused for this tenant")
    config = TenantConfig.model_validate(row.config or {})
    limits = replace(
        limits,
        active_turns_per_user=config.max_active_turns_per_user or limits.active_turns_per_user,
        user_per_minute=config.user_requests_per_minute or limits.user_per_minute,
    )
    if row.running >= limits.active_turns_per_user:
        raise TooManyActiveTurns(
            f"at most {limits.active_turns_per_user} answers can run at once for a user",
            retry_after_s=2,
        )
    return Admission(config, _takes(row.now, owner, limits, config))


def _takes(now: datetime, owner: Identity, limits: Limits, config: TenantConfig) -> list[Take]:
    """The windowed counters a post takes: per minute for the user and the tenant, per day
    where a cap is set (the tenant's own daily cap for the user overrides the deployment's)."""
    minute = now.replace(second=0, microsecond=0)
    user, tenant_id = f"{owner.tenant_id}/{owner.user_id}", owner.tenant_id
    takes = [
        Take(
            scope=f"minute_{who}",
            subject=subject,
            window=minute,
            limit=limit,
            refusal=RateLimited(
                f"at most {limit} messages a minute for this {who}",
                retry_after_s=seconds_until(now, minute + timedelta(minutes=1)),
            ),
        )
        for who, subject, limit in (
            ("user", user, limits.user_per_minute),
            ("tenant", tenant_id, limits.tenant_per_minute),
        )
    ]
    user_cap = config.user_daily_cap if config.user_daily_cap is not None else limits.user_per_day
    day = now.replace(hour=0, minute=0, second=0, microsecond=0)
    takes += [
        Take(
            scope=scope,
            subject=subject,
            window=day,
            limit=cap,
            refusal=DailyCapReached(
                f"{who} daily message cap is reached",
                retry_after_s=seconds_until(now, day + timedelta(days=1)),
            ),
        )
        for who, scope, subject, cap in (
            ("your", "day_user", user, user_cap),
            ("the tenant's", "day_tenant", tenant_id, config.daily_cap),
        )
        if cap is not None
    ]
    return takes


async def admit_session(db: Db, *, owner: Identity, per_day: int) -> None:
    """Count a new session against the user's sessions of the UTC day."""
    now = await _now(db)
    day = now.replace(hour=0, minute=0, second=0, microsecond=0)
    refusal = RateLimited(
        f"at most {per_day} new sessions a day",
        retry_after_s=seconds_until(now, day + timedelta(days=1)),
    )
    subject = f"{owner.tenant_id}/{owner.user_id}"
    await take_all(db, [Take("day_sessions", subject, day, per_day, refusal)])


async def send_running(db: Db, *, owner: Identity, limits: Limits) -> Sent[_RunningAndTenant]:
    """Send (or queue, `Db.together`) the read `admission` decides on: the database's clock
    (so every API process puts a post in the same window), the user's running turns, and the
    tenant's switch and configuration (a tenant without a row is not paused and configures
    nothing), in one statement. The caller's transaction holds the user's lock
    (`locks.user_turns`) already, taken by an earlier statement: two posts of one user cannot
    both see room for one more turn, and the count must be read after the lock is held."""
    params = {
        "tenant_id": owner.tenant_id,
        "user_id": owner.user_id,
        "stale": timedelta(seconds=limits.turn_stale_after_s),
    }
    return await db.send(_RUNNING_AND_TENANT, params, _RunningAndTenant)


@dataclass(frozen=True)
class _RunningAndTenant:
    now: datetime
    running: int
    paused: bool | None  # None: the tenant has no row
    config: dict[str, Any] | None


# Plain SQL on the session's own connection (see store/identity.py `_IDENTITY`): every post
# runs it. The states in which a turn does no model work, as SQL literals (sorted: the same
# text in every process).
_IDLE = ", ".join(sorted(f"'{state.value}'" for state in (*TERMINAL_TURN_STATES, *RESTING)))
_RUNNING_AND_TENANT = f"""
    SELECT now() AS now,
        (SELECT count(*) FROM turns
            WHERE tenant_id = %(tenant_id)s AND user_id = %(user_id)s
                AND state NOT IN ({_IDLE})
                AND updated_at > now() - %(stale)s
        ) AS running,
        (SELECT paused FROM tenants WHERE id = %(tenant_id)s) AS paused,
        (SELECT config FROM tenants WHERE id = %(tenant_id)s) AS config
"""


@dataclass(frozen=True)
class Take:
    """One use to count in a window, refused with `refusal` when the window is full."""

    scope: str
    subject: str
    window: datetime
    limit: int
    refusal: RateLimited


async def take_all(db: Db, takes: Sequence[Take]) -> None:
    """Count one use in each window, or raise the first full window's refusal. One statement
    for all of them (a refusal rolls the caller's transaction back, so the others count for
    nothing either). A counting error lets the use through (logged): the limits protect the
    operator's bill, and an outage of this table must not take the product down with it."""

    async def nothing() -> None:
        return None

    await take_all_then(db, takes, nothing)


async def take_all_then(db: Db, takes: Sequence[Take], write: Callable[[], Awaitable[T]]) -> T:
    """`take_all`, and the statement `write` sends, in one round trip (`Db.together`): the
    write runs before the counts are looked at, so on a refusal it is raised all the same,
    and the caller's transaction, rolled back, undoes the write with the counts. A counting
    error lets the use through as `take_all` does: the counts are undone to their savepoint
    and the write, which did not run, is sent again on its own. Returns what `write` did."""
    for take in takes:
        if take.limit <= 0:
            raise take.refusal
    if not takes:
        return await write()
    params: dict[str, Any] = {}
    for i, take in enumerate(takes):
        params |= {f"scope{i}": take.scope, f"subject{i}": take.subject}
        params |= {f"window{i}": take.window, f"limit{i}": take.limit}
    try:
        # In a savepoint: a counting error must not abort the caller's transaction.
        async with db.together():
            await db.run(_SAVEPOINT, {})
            taking = await db.send_made(_take_statement(len(takes)), params, _taken)
            await db.run(_RELEASE_SAVEPOINT, {})
            written = await write()
        row = await taking.row()
    except StoreError:
        scopes = ", ".join(f"{t.scope} for {t.subject}" for t in takes)
        log.warning("could not count %s; letting it through", scopes, exc_info=True)
        await db.run(_ROLLBACK_TO_SAVEPOINT, {})
        return await write()
    assert row is not None  # a select list without FROM: always one row
    for take, taken in zip(takes, row, strict=True):
        if not taken:
            raise take.refusal
    return written


def _taken(**taken: bool) -> list[bool]:
    """Whether each window took its use, in the order of the takes (`taken0`, `taken1`, …)."""
    return [taken[f"taken{i}"] for i in range(len(taken))]


_SAVEPOINT = "SAVEPOINT take_all"
_RELEASE_SAVEPOINT = "RELEASE SAVEPOINT take_all"
_ROLLBACK_TO_SAVEPOINT = "ROLLBACK TO SAVEPOINT take_all"


@functools.cache  # one statement per number of windows (at most four), built once
def _take_statement(n: int) -> str:
    """Upsert each counter (only while under its limit) and forget the subject's older windows
    once a new window opens; select whether each use was taken."""
    parts = []
    for i in range(n):
        parts.append(
            f"""take{i} AS (
        INSERT INTO usage_counters (scope, subject, window_start, used)
        VALUES (%(scope{i})s, %(subject{i})s, %(window{i})s, 1)
        ON CONFLICT (scope, subject, window_start)
        DO UPDATE SET used = usage_counters.used + 1 WHERE usage_counters.used < %(limit{i})s
        RETURNING (xmax = 0) AS fresh
    ), forget{i} AS (
        DELETE FROM usage_counters
        WHERE scope = %(scope{i})s AND subject = %(subject{i})s
            AND window_start < %(window{i})s
            AND EXISTS (SELECT 1 FROM take{i} WHERE fresh)
    )"""
        )
    taken = ", ".join(f"EXISTS (SELECT 1 FROM take{i}) AS taken{i}" for i in range(n))
    return f"WITH {', '.join(parts)} SELECT {taken}"


# --- open streams -------------------------------------------------------------------------


async def take_stream_lease(
    conn: Db, *, owner: Identity, limit: int, lease_s: float, turn: tuple[str, str | None]
) -> str | None:
    """A lease for one more open stream of the user's turn `turn` (session id, turn id; no
    turn id: the session's own stream), or None at the limit; LookupError when the turn (or
    the session) is not theirs. In the caller's unit of work, in one round trip: one
    statement finds the owner's turn and takes the user's lock, then one (which sees what
    committed before that lock was taken) forgets the user's lapsed leases and takes the new
    one if the live ones leave room. For a turn not theirs no lock is taken, and a lease the
    second statement took goes with the unit of work, which the caller does not commit."""
    session_id, turn_id = turn
    who = {"tenant_id": owner.tenant_id, "user_id": owner.user_id}
    params = {"turn_id": turn_id, "session_id": session_id}
    key = {"lock_key": locks.user_streams(owner)}
    found = _LOCK_FOR_TURN if turn_id is not None else _LOCK_FOR_SESSION
    lease_id = new_id("lse")
    following = session_id if turn_id is None else None  # a session stream watches its turns
    asked = {"id": lease_id, "limit": limit, "lease_s": lease_s, "following": following}
    async with conn.together():
        locked = await conn.send_made(found, params | who | key, _a_row)
        taken = await conn.send_made(_TAKE_LEASE, who | asked, _a_row)
    if await locked.row() is None:
        raise LookupError(turn_id or session_id)
    return lease_id if await taken.row() is not None else None


def _a_row(**_columns: object) -> bool:
    """That the statement returned a row, whatever its columns."""
    return True


async def take_case_stream_lease(
    conn: Db, *, owner: Identity, limit: int, lease_s: float
) -> str | None:
    """A lease for one more open stream of a hand-off's (api/case_stream.py), whose caller
    has checked the case is the user's to read (the customer's session's, or their tenant's
    for an agent); None at the limit. It follows no session: a case stream is not a watch on
    the session's running turn (store/viewers.py)."""
    who = {"tenant_id": owner.tenant_id, "user_id": owner.user_id}
    await conn.value(_LOCK_USER_STREAMS, {"lock_key": locks.user_streams(owner)})
    lease_id = new_id("lse")
    asked = {"id": lease_id, "limit": limit, "lease_s": lease_s, "following": None}
    taken = await conn.value(_TAKE_LEASE, who | asked)
    return lease_id if taken is not None else None


_LOCK_USER_STREAMS = f"SELECT 1, {locks.TAKE}"


# The lock is taken for the row found (a select list is computed only for rows that pass
# the WHERE), so a turn of someone else's takes no lock. Its one column is the void the lock
# function returns, so the row is selected with a constant beside it.
_LOCK_FOR_TURN = f"""
    SELECT 1, {locks.TAKE}
    FROM turns AS t JOIN sessions AS s ON s.id = t.session_id
    WHERE t.id = %(turn_id)s AND t.session_id = %(session_id)s AND t.tenant_id = %(tenant_id)s
        AND t.user_id = %(user_id)s AND s.deleted_at IS NULL
"""
_LOCK_FOR_SESSION = f"""
    SELECT 1, {locks.TAKE}
    FROM sessions AS s
    WHERE s.id = %(session_id)s AND s.tenant_id = %(tenant_id)s AND s.user_id = %(user_id)s
        AND s.deleted_at IS NULL
"""


# The CTEs see the table as it was before the statement: the count skips lapsed leases
# itself rather than relying on the DELETE beside it.
_TAKE_LEASE = """
    WITH lapsed AS (
        DELETE FROM stream_leases
        WHERE tenant_id = %(tenant_id)s AND user_id = %(user_id)s AND expires_at <= now()
    ), held AS (
        SELECT count(*) AS n FROM stream_leases
        WHERE tenant_id = %(tenant_id)s AND user_id = %(user_id)s AND expires_at > now()
    )
    INSERT INTO stream_leases (id, tenant_id, user_id, expires_at, session_id)
    SELECT %(id)s, %(tenant_id)s, %(user_id)s, now() + make_interval(secs => %(lease_s)s),
        %(following)s
    FROM held WHERE held.n < %(limit)s
    RETURNING id
"""


async def end_stream(conn: Db, *, lease_id: str, turn_id: str | None) -> None:
    """Drop a stream's lease and, when it counted as a viewer of `turn_id`, detach it
    (store/viewers.py), in one statement (on a connection in autocommit, `store.db.connect`,
    it commits by itself)."""
    if turn_id is None:
        await conn.run(_DROP_LEASE, {"lease_id": lease_id})
        return
    await conn.run(_END_STREAM, {"lease_id": lease_id, "turn_id": turn_id})


_DROP_LEASE = "DELETE FROM stream_leases WHERE id = %(lease_id)s"
_END_STREAM = f"""
    WITH dropped AS (DELETE FROM stream_leases WHERE id = %(lease_id)s)
    {DETACH_VIEWER_SQL}
"""


async def renew_stream_leases(db: Db, *, lease_ids: list[str], lease_s: float) -> None:
    await db.run(_RENEW_LEASES, {"lease_ids": lease_ids, "lease_s": lease_s})


async def drop_stream_leases(db: Db, *, lease_ids: list[str]) -> None:
    await db.run(_DROP_LEASES, {"lease_ids": lease_ids})


_RENEW_LEASES = """
    UPDATE stream_leases SET expires_at = now() + make_interval(secs => %(lease_s)s)
    WHERE id = ANY(%(lease_ids)s)
"""
_DROP_LEASES = "DELETE FROM stream_leases WHERE id = ANY(%(lease_ids)s)"


# --- helpers ------------------------------------------------------------------------------


async def _now(db: Db) -> datetime:
    """The database's clock: every API process puts a post in the same window."""
    now = await db.value(_NOW, {})
    assert now is not None
    return cast(datetime, now)


_NOW = "SELECT now()"


def seconds_until(now: datetime, end: datetime) -> int:
    """A `Retry-After` in whole seconds: rounded up, so a client that waits it is past `end`,
    and never 0 (which would invite an immediate retry)."""
    return max(1, int((end - now).total_seconds() + 0.999))
