"""The approvals' clock in the store (parley/approvals.py): the `confirmation_expiring` warning
shown once per card, a lapsed card renewed as a new one, and the renewals' start outbox.

The cards themselves are store/actions.py's rows (`ActionRow`); this module adds the columns
the clock keeps (`warned_at`, `renewed_from`, `renewal_started_at`). Everything here runs in
the caller's unit of work (store/db.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from parley.approvals import CARD_RENEWALS, CARD_WARNINGS
from parley.contracts import EventType
from parley.errors import ActionNotExpired, NotFound
from parley.ids import renewal_action_id
from parley.statuses import ActionStatus
from parley.store.actions import (
    ACTION_NOT_FOUND,
    LOCK_OWNED,
    ActionRow,
    expire_locked,
    get_action,
    shown,
)
from parley.store.db import Db
from parley.store.events import append_event
from parley.store.identity import Identity
from parley.wire import ActionData, ActionView


async def warn_expiring(db: Db, *, default_lead_s: float, limit: int = 100) -> list[ActionRow]:
    """Show `confirmation_expiring` on every pending card whose warning is due (its tenant's
    `confirmation_warning_s` before it lapses, else `default_lead_s`) and not shown yet, once
    per card: one statement marks them (`warned_at`), skipping rows another sweep holds, and
    the events go on their turns' streams in the same transaction (the caller commits)."""
    params = {"now": datetime.now(UTC), "default_lead_s": default_lead_s, "limit": limit}
    warned = await db.rows(_DUE_WARNINGS, params, ActionRow)
    for action in warned:
        await append_event(
            db,
            turn_id=action.turn_id,
            type=EventType.confirmation_expiring,
            data=ActionData(action=ActionView.from_row(action)),
        )
    CARD_WARNINGS.inc(len(warned))
    return warned


# The lead time is the tenant's setting over the deployment's (parley/approvals.py); the
# predicate on `actions` is the partial index `ix_actions_unwarned`'s.
_DUE_WARNINGS = f"""
    WITH due AS (
        SELECT a.id FROM actions a LEFT JOIN tenants t ON t.id = a.tenant_id
        WHERE a.status = 'pending' AND a.warned_at IS NULL AND a.expires_at > %(now)s
            AND a.expires_at - make_interval(secs => COALESCE(
                CAST(t.config ->> 'confirmation_warning_s' AS double precision),
                %(default_lead_s)s)) <= %(now)s
        ORDER BY a.expires_at LIMIT %(limit)s
        FOR UPDATE OF a SKIP LOCKED
    )
    UPDATE actions SET warned_at = %(now)s FROM due
    WHERE actions.id = due.id AND actions.warned_at IS NULL
    RETURNING {", ".join(f"actions.{c.strip()}" for c in ActionRow.COLUMNS.split(","))}
"""


@dataclass(frozen=True)
class Renewal:
    """The card a renew answers with, and whether this request made it (False: an earlier
    renew of the same expired card did, and this one answers the same card)."""

    action: ActionRow
    created: bool


async def renew_action(
    db: Db, *, action_id: str, session_id: str, owner: Identity, ttl: timedelta
) -> Renewal:
    """A new pending card for an expired one of the owner's: the same tool, arguments and
    digest, a window of `ttl`, its `confirmation_required` on the turn's stream. An expired
    card is renewed once: asking again answers that renewal. Another user's card is
    `NotFound`; a card that has not expired is `ActionNotExpired` (a pending one whose window
    has just passed is stored expired first, as a confirm would). The caller has checked the
    user's access and commits."""
    owned = {
        "id": action_id,
        "session_id": session_id,
        "tenant_id": owner.tenant_id,
        "user_id": owner.user_id,
    }
    action = await db.row(LOCK_OWNED, owned, ActionRow)
    if action is None:
        raise NotFound(ACTION_NOT_FOUND)
    if action.status == ActionStatus.pending and action.expires_at <= datetime.now(UTC):
        action = await expire_locked(db, action)
    if action.status != ActionStatus.expired:
        raise ActionNotExpired(
            f"only an expired card can be renewed; this one is {action.status}",
            action=shown(action),
        )
    renewal_id = renewal_action_id(action_id=action.id)
    params = {
        "id": renewal_id,
        "from": action.id,
        "status": ActionStatus.pending.value,
        "expires_at": datetime.now(UTC) + ttl,
    }
    made = await db.row(_RENEW, params, ActionRow)
    if made is None:  # renewed before (the row is locked, so that renewal is committed)
        earlier = await get_action(db, action_id=renewal_id)
        assert earlier is not None
        return Renewal(earlier, created=False)
    await append_event(
        db,
        turn_id=made.turn_id,
        type=EventType.confirmation_required,
        data=ActionData(action=ActionView.from_row(made)),
    )
    CARD_RENEWALS.inc()
    return Renewal(made, created=True)


# A copy of the expired row's proposal: the card shows what the user was first shown.
_RENEW = f"""
    INSERT INTO actions
        (id, session_id, turn_id, tenant_id, user_id, tool, args, args_hash, summary,
        recipient_masked, status, expires_at, renewed_from)
    SELECT %(id)s, session_id, turn_id, tenant_id, user_id, tool, args, args_hash, summary,
        recipient_masked, %(status)s, %(expires_at)s, id
    FROM actions WHERE id = %(from)s
    ON CONFLICT DO NOTHING
    RETURNING {ActionRow.COLUMNS}
"""


# The renewals' start outbox (dispatch/approvals.py): the API starts a renewal's workflow
# after its commit, and the worker's sweep starts one whose start was lost.


async def unstarted_renewals(db: Db, *, older_than: timedelta, limit: int = 50) -> list[ActionRow]:
    """Renewed cards made more than `older_than` ago whose workflow nobody marked started,
    oldest first (answered or not: an answer waits for that workflow to take it)."""
    params = {"cutoff": datetime.now(UTC) - older_than, "limit": limit}
    return await db.rows(_UNSTARTED_RENEWALS, params, ActionRow)


# The predicate as the partial index `ix_actions_renewal_unstarted` spells it.
_UNSTARTED_RENEWALS = f"""
    SELECT {ActionRow.COLUMNS} FROM actions
    WHERE renewed_from IS NOT NULL AND renewal_started_at IS NULL AND created_at < %(cutoff)s
    ORDER BY created_at LIMIT %(limit)s
"""


async def mark_renewal_started(db: Db, *, action_id: str) -> None:
    """The renewal's workflow has started: the sweep leaves it alone."""
    await db.run(_RENEWAL_STARTED, {"id": action_id, "now": datetime.now(UTC)})


_RENEWAL_STARTED = """
    UPDATE actions SET renewal_started_at = %(now)s
    WHERE id = %(id)s AND renewal_started_at IS NULL
"""


async def renewals_of(db: Db, *, turn_ids: list[str]) -> dict[str, list[str]]:
    """The renewed cards of these turns, by turn: each has a workflow of its own, which an
    erasure deletes with the turn's (activities/erasure.py)."""
    rows = await db.rows(_RENEWALS_OF, {"turn_ids": turn_ids}, _Renewed)
    found: dict[str, list[str]] = {}
    for row in rows:
        found.setdefault(row.turn_id, []).append(row.id)
    return found


@dataclass(frozen=True)
class _Renewed:
    id: str
    turn_id: str


_RENEWALS_OF = """
    SELECT id, turn_id FROM actions
    WHERE turn_id = ANY(%(turn_ids)s) AND renewed_from IS NOT NULL
    ORDER BY created_at
"""
