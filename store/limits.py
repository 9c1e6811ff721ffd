"""Abuse limits kept in PostgreSQL, so that every API process counts against the same numbers.

Checked before a posted message may start model work, cheapest first (`admit_turn`):

    paused tenant            403 agent_paused           (the caller reads the tenant row)
    running turns per user   429 too_many_active_turns  (one indexed count under a user lock)
    posts per minute         429 rate_limited           (user, then tenant; Retry-After)
    messages per UTC day     429 daily_cap_reached      (user, then tenant)

Windowed limits are counters (`usage_counters`), taken by one conditional upsert: the row is
locked while it is counted, so concurrent posts in any process never exceed a cap. The count
joins the caller's transaction: a post refused later (409, or a cap after this one) counts
for nothing. A counting error fails open (the post goes through and the error is logged);
pause fails closed, because an error reading the tenant row fails the request.

Open event streams per user are leases (`stream_leases`) that their API process renews; a
process that dies stops renewing, and its leases lapse.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from datetime import datetime, timedelta

from sqlalchemy import delete, func, select, text, update
from sqlalchemy.ext.asyncio import AsyncSession

from parley.config import Limits
from parley.contracts import TERMINAL_TURN_STATES, TurnState
from parley.errors import RateLimited
from parley.ids import new_id
from parley.tenancy import TenantConfig
from store.identity import Identity
from store.models import StreamLease, Tenant, Turn

log = logging.getLogger(__name__)

# States in which a turn does no model work: it waits for its user.
RESTING = (TurnState.awaiting_confirmation, TurnState.awaiting_input)


async def admit_turn(
    db: AsyncSession, *, owner: Identity, tenant: Tenant | None, limits: Limits
) -> None:
    """Refuse a post that would go over a limit, counting it against the windowed ones.
    The tenant's configuration, where it sets a limit, overrides the deployment's."""
    config = TenantConfig.model_validate((tenant.config if tenant is not None else None) or {})
    limits = replace(
        limits,
        active_turns_per_user=config.max_active_turns_per_user or limits.active_turns_per_user,
        user_per_minute=config.user_requests_per_minute or limits.user_per_minute,
    )
    await _check_running_turns(db, owner=owner, limits=limits)
    now = await _now(db)
    minute = now.replace(second=0, microsecond=0)
    user, tenant_id = f"{owner.tenant_id}/{owner.user_id}", owner.tenant_id
    for who, subject, limit in (
        ("user", user, limits.user_per_minute),
        ("tenant", tenant_id, limits.tenant_per_minute),
    ):
        await take(
            db,
            scope=f"minute_{who}",
            subject=subject,
            window=minute,
            limit=limit,
            refusal=RateLimited(
                f"at most {limit} messages a minute for this {who}",
                retry_after_s=seconds_until(now, minute + timedelta(minutes=1)),
            ),
        )
    user_cap = config.user_daily_cap if config.user_daily_cap is not None else limits.user_per_day
    day = now.replace(hour=0, minute=0, second=0, microsecond=0)
    for who, scope, subject, cap in (
        ("your", "day_user", user, user_cap),
        ("the tenant's", "day_tenant", tenant_id, config.daily_cap),
    ):
        if cap is None:
            continue
        await take(
            db,
            scope=scope,
            subject=subject,
            window=day,
            limit=cap,
            refusal=RateLimited(
                f"{who} daily message cap is reached",
                retry_after_s=seconds_until(now, day + timedelta(days=1)),
                code="daily_cap_reached",
            ),
        )


async def admit_session(db: AsyncSession, *, owner: Identity, per_day: int) -> None:
    """Count a new session against the user's sessions of the UTC day."""
    now = await _now(db)
    day = now.replace(hour=0, minute=0, second=0, microsecond=0)
    await take(
        db,
        scope="day_sessions",
        subject=f"{owner.tenant_id}/{owner.user_id}",
        window=day,
        limit=per_day,
        refusal=RateLimited(
            f"at most {per_day} new sessions a day",
            retry_after_s=seconds_until(now, day + timedelta(days=1)),
        ),
    )


async def _check_running_turns(db: AsyncSession, *, owner: Identity, limits: Limits) -> None:
    # The user's lock, held to the end of the caller's transaction: two posts of one user
    # cannot both see room for one more turn.
    await _lock(db, f"turns:{owner.tenant_id}/{owner.user_id}")
    stale = timedelta(seconds=limits.turn_stale_after_s)
    running = await db.scalar(
        select(func.count())
        .select_from(Turn)
        .where(
            Turn.tenant_id == owner.tenant_id,
            Turn.user_id == owner.user_id,
            Turn.state.not_in([*TERMINAL_TURN_STATES, *RESTING]),
            Turn.updated_at > func.now() - stale,
        )
    )
    if int(running or 0) >= limits.active_turns_per_user:
        raise RateLimited(
            f"at most {limits.active_turns_per_user} answers can run at once for a user",
            retry_after_s=2,
            code="too_many_active_turns",
        )


async def take(
    db: AsyncSession,
    *,
    scope: str,
    subject: str,
    window: datetime,
    limit: int,
    refusal: RateLimited,
) -> None:
    """Count one use in the window, or raise `refusal` if the window is full. A counting
    error lets the use through (logged): the limits protect the operator's bill, and an
    outage of this table must not take the product down with it."""
    if limit <= 0:
        raise refusal
    params = {"scope": scope, "subject": subject, "window": window, "limit": limit}
    try:
        async with db.begin_nested():
            row = (await db.execute(_TAKE, params)).first()
            if row is not None and row.fresh:
                # A new window: the subject's older windows are done with.
                await db.execute(_FORGET, params)
    except Exception:
        log.warning("could not count %s for %s; letting it through", scope, subject, exc_info=True)
        return
    if row is None:
        raise refusal


_TAKE = text(
    """
    INSERT INTO usage_counters (scope, subject, window_start, used)
    VALUES (:scope, :subject, :window, 1)
    ON CONFLICT (scope, subject, window_start)
    DO UPDATE SET used = usage_counters.used + 1 WHERE usage_counters.used < :limit
    RETURNING used, (xmax = 0) AS fresh
    """
)
_FORGET = text(
    "DELETE FROM usage_counters "
    "WHERE scope = :scope AND subject = :subject AND window_start < :window"
)


# --- open streams -------------------------------------------------------------------------


async def take_stream_lease(
    db: AsyncSession, *, owner: Identity, limit: int, lease_s: float
) -> str | None:
    """A lease for one more open stream of the user, or None at the limit."""
    await _lock(db, f"streams:{owner.tenant_id}/{owner.user_id}")
    mine = (StreamLease.tenant_id == owner.tenant_id) & (StreamLease.user_id == owner.user_id)
    await db.execute(delete(StreamLease).where(mine, StreamLease.expires_at <= func.now()))
    held = await db.scalar(select(func.count()).select_from(StreamLease).where(mine))
    if int(held or 0) >= limit:
        return None
    lease = StreamLease(
        id=new_id("lse"),
        tenant_id=owner.tenant_id,
        user_id=owner.user_id,
        expires_at=func.now() + timedelta(seconds=lease_s),
    )
    db.add(lease)
    await db.flush()
    return lease.id


async def renew_stream_leases(db: AsyncSession, *, lease_ids: list[str], lease_s: float) -> None:
    await db.execute(
        update(StreamLease)
        .where(StreamLease.id.in_(lease_ids))
        .values(expires_at=func.now() + timedelta(seconds=lease_s))
    )


async def drop_stream_leases(db: AsyncSession, *, lease_ids: list[str]) -> None:
    await db.execute(delete(StreamLease).where(StreamLease.id.in_(lease_ids)))


# --- helpers ------------------------------------------------------------------------------


async def _now(db: AsyncSession) -> datetime:
    """The database's clock: every API process puts a post in the same window."""
    now = await db.scalar(select(func.now()))
    assert now is not None
    return now


async def _lock(db: AsyncSession, key: str) -> None:
    await db.execute(select(func.pg_advisory_xact_lock(func.hashtext(key))))


def seconds_until(now: datetime, end: datetime) -> int:
    """A `Retry-After` in whole seconds: rounded up, so a client that waits it is past `end`,
    and never 0 (which would invite an immediate retry)."""
    return max(1, int((end - now).total_seconds() + 0.999))
