"""Pending actions (proposal, confirmation, execution); hand-offs live in store/handoffs.py.

Every function hands back a typed row (`ActionRow`), never an ORM object, and
every status change is one statement (`UPDATE … RETURNING`) whose `WHERE` says which status
it may leave: two confirms that race execute once, because exactly one of them sees its row
change. Rows a tool call creates are inserted with an id derived from the call
(`… ON CONFLICT DO NOTHING`), so a retried attempt finds the row the first one wrote, and a
row found under that id must belong to the same session, tenant and user.

Everything here runs in the caller's unit of work (store/db.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar, Protocol

from psycopg.types.json import Jsonb

from parley.approvals import CARD_OUTCOMES, OUTCOMES
from parley.contracts import TERMINAL_TURN_STATES, EventType
from parley.errors import ActionChanged, ActionExpired, ActionResolved, ActionSuperseded, NotFound
from parley.statuses import ActionStatus, Decision
from parley.store.db import Db
from parley.store.events import append_event
from parley.store.identity import Identity
from parley.store.turns import TurnStopped
from parley.tools import args_hash
from parley.wire import ActionData, ActionView, card_attachment

ACTION_NOT_FOUND = "action not found"


class ForeignRow(Exception):
    """A derived id already names a row of another session, tenant or user: a bug, never
    something to hand back."""


@dataclass(frozen=True)
class ActionRow:
    """A proposal as it is stored: what the card shows, what the send re-checks, how it
    ended. Read-only: a change of status is a statement here (`set_action_status`)."""

    id: str
    session_id: str
    turn_id: str
    tenant_id: str
    user_id: str
    tool: str
    args: dict[str, Any]
    # Binds a confirmation to exactly these arguments (`parley.tools.args_hash`).
    args_hash: str
    summary: str
    recipient_masked: str | None
    status: str
    # Why code declined it (`DeclineReason`), or the user's reason.
    decline_reason: str | None
    outcome: dict[str, Any] | None
    expires_at: datetime
    created_at: datetime
    resolved_at: datetime | None
    # The expired card this one renews (`renew_action`); its answer goes to the renewal's
    # own workflow, not to the turn, which has ended.
    renewed_from: str | None

    COLUMNS: ClassVar[str] = (
        "id, session_id, turn_id, tenant_id, user_id, tool, args, args_hash, summary,"
        " recipient_masked, status, decline_reason, outcome, expires_at, created_at, resolved_at,"
        " renewed_from"
    )

    @property
    def attachment(self) -> dict[str, Any] | None:
        """The file the card names (`{name, rows}`), when the proposal carries one."""
        return card_attachment(self.args)


class ProposingTurn(Protocol):
    """The turn a proposal belongs to (`TurnFacts`, or any row naming its owners)."""

    @property
    def id(self) -> str: ...
    @property
    def session_id(self) -> str: ...
    @property
    def tenant_id(self) -> str: ...
    @property
    def user_id(self) -> str: ...


async def create_action(
    db: Db,
    *,
    turn: ProposingTurn,
    action_id: str,
    tool: str,
    args: dict[str, Any],
    summary: str,
    recipient_masked: str | None,
    ttl: timedelta,
) -> ActionRow:
    """The proposal's pending action, once: a retried attempt gets the row the first wrote.
    A turn that ended or is being cancelled gets none (`TurnStopped`): no card outlives a
    Stop. One statement locks the turn (endings take the same lock, so either the card comes
    first and the ending declines it, or the ending comes first and there is no card) and
    inserts the row if the turn still runs."""
    params = {
        "id": action_id,
        "session_id": turn.session_id,
        "turn_id": turn.id,
        "tenant_id": turn.tenant_id,
        "user_id": turn.user_id,
        "tool": tool,
        "args": Jsonb(args),
        "args_hash": args_hash(tool, args),
        "summary": summary,
        "recipient_masked": recipient_masked,
        "status": ActionStatus.pending.value,
        "expires_at": datetime.now(UTC) + ttl,
        "terminal": sorted(s.value for s in TERMINAL_TURN_STATES),
    }
    found = await db.made(_PROPOSE, params, _proposed)
    if found is None:
        raise LookupError(turn.id)
    if found.turn_state in TERMINAL_TURN_STATES:
        raise TurnStopped(turn.id, found.turn_state)
    if found.cancel_requested_at is not None:
        raise TurnStopped(turn.id, "cancelling")
    # Inserted by this statement, or by an earlier attempt (this statement's snapshot may
    # predate a racing attempt's commit: read it again).
    action = found.action or await get_action(db, action_id=action_id)
    assert action is not None
    owner = (action.session_id, action.turn_id, action.tenant_id, action.user_id)
    if owner != (turn.session_id, turn.id, turn.tenant_id, turn.user_id):
        raise ForeignRow(f"action {action_id} belongs to another turn")
    return action


@dataclass(frozen=True)
class _Proposed:
    """What `_PROPOSE` finds: the turn as locked, and the action (None when the turn had
    stopped, so nothing was inserted)."""

    turn_state: str
    cancel_requested_at: datetime | None
    action: ActionRow | None


def _proposed(
    *, turn_state: str, cancel_requested_at: datetime | None, **columns: Any
) -> _Proposed:
    action = ActionRow(**columns) if columns["id"] is not None else None
    return _Proposed(turn_state, cancel_requested_at, action)


# The main query's read of `actions` sees the snapshot from before the insert, so exactly one
# of the two arms holds the row: the one inserted, or the one an earlier attempt wrote.
_PROPOSE = f"""
    WITH turn AS (
        SELECT id, state, cancel_requested_at FROM turns WHERE id = %(turn_id)s FOR UPDATE
    ), made AS (
        INSERT INTO actions
            (id, session_id, turn_id, tenant_id, user_id, tool, args, args_hash, summary,
            recipient_masked, status, expires_at)
        SELECT %(id)s, %(session_id)s, turn.id, %(tenant_id)s, %(user_id)s, %(tool)s,
            %(args)s, %(args_hash)s, %(summary)s, %(recipient_masked)s, %(status)s,
            %(expires_at)s
        FROM turn
        WHERE turn.state <> ALL(%(terminal)s) AND turn.cancel_requested_at IS NULL
        ON CONFLICT (id) DO NOTHING
        RETURNING {ActionRow.COLUMNS}
    ), action AS (
        SELECT {ActionRow.COLUMNS} FROM made
        UNION ALL
        SELECT {ActionRow.COLUMNS} FROM actions WHERE id = %(id)s
    )
    SELECT turn.state AS turn_state, turn.cancel_requested_at, action.*
    FROM turn LEFT JOIN action ON true
    LIMIT 1
"""


async def pending_action(db: Db, *, session_id: str) -> ActionRow | None:
    """The session's newest action still waiting for the user."""
    params = {"session_id": session_id, "pending": ActionStatus.pending.value}
    return await db.row(_PENDING, params, ActionRow)


_PENDING = f"""
    SELECT {ActionRow.COLUMNS} FROM actions
    WHERE session_id = %(session_id)s AND status = %(pending)s
    ORDER BY created_at DESC LIMIT 1
"""


async def resolve_action(
    db: Db,
    *,
    action_id: str,
    session_id: str,
    owner: Identity | None,
    decision: Decision,
    reason: str | None = None,
) -> ActionRow:
    """Confirm or decline a pending action for its own user; raise the contract's conflicts.

    Appends `confirmation_resolved` to the turn. An action whose window has passed is stored
    `expired` before `ActionExpired` is raised: the caller commits that, then answers.
    """
    params = {"id": action_id, "session_id": session_id}
    if owner is None:
        action = await db.row(_LOCK, params, ActionRow)
    else:
        owned = {**params, "tenant_id": owner.tenant_id, "user_id": owner.user_id}
        action = await db.row(LOCK_OWNED, owned, ActionRow)
    if action is None:
        raise NotFound(ACTION_NOT_FOUND)
    if action.status == ActionStatus.expired:
        raise ActionExpired("the confirmation window has passed", action=shown(action))
    if action.status == ActionStatus.superseded:
        raise ActionSuperseded("the user moved on from this card", action=shown(action))
    if action.status != ActionStatus.pending:
        raise ActionResolved(f"the action is already {action.status}", action=shown(action))
    pending = (ActionStatus.pending,)
    if action.expires_at <= datetime.now(UTC):
        expired = await expire_locked(db, action)
        raise ActionExpired("the confirmation window has passed", action=shown(expired))
    if decision == Decision.confirmed and args_hash(action.tool, action.args) != action.args_hash:
        raise ActionChanged("the action changed after it was shown; nothing was sent")
    resolved = await set_action_status(
        db,
        action_id=action_id,
        status=ActionStatus(decision),
        only_from=pending,
        decline_reason=reason,
    )
    if resolved is None:
        raise ActionResolved("the action is already resolved")
    await announce_resolution(db, action=resolved)
    return resolved


_LOCK = f"""
    SELECT {ActionRow.COLUMNS} FROM actions
    WHERE id = %(id)s AND session_id = %(session_id)s
    FOR UPDATE
"""
LOCK_OWNED = f"""
    SELECT {ActionRow.COLUMNS} FROM actions
    WHERE id = %(id)s AND session_id = %(session_id)s
        AND tenant_id = %(tenant_id)s AND user_id = %(user_id)s
    FOR UPDATE
"""


async def expire_locked(db: Db, action: ActionRow) -> ActionRow:
    """A pending card, locked by the caller, whose window has passed: stored `expired` and
    announced now, before its wait's own timer does (which then finds it expired)."""
    expired = await set_action_status(
        db, action_id=action.id, status=ActionStatus.expired, only_from=(ActionStatus.pending,)
    )
    assert expired is not None  # the row is locked, and was pending
    await announce_resolution(db, action=expired)
    return expired


async def announce_resolution(db: Db, *, action: ActionRow) -> None:
    """Tell the turn's stream how its confirmation ended (`confirmation_resolved`), and
    count the outcome (parley/approvals.py)."""
    await append_event(
        db,
        turn_id=action.turn_id,
        type=EventType.confirmation_resolved,
        data=ActionData(action=ActionView.from_row(action)),
    )
    if action.status in OUTCOMES:
        CARD_OUTCOMES.labels(outcome=action.status).inc()


def shown(action: ActionRow) -> dict[str, Any]:
    """The action as an error answer carries it (its `action` field)."""
    return ActionView.from_row(action).model_dump(mode="json")


# Statuses that answer the card: they stamp `resolved_at`. The outcomes of a send
# (executed, unknown, failed) leave it as the answer set it.
_RESOLUTIONS = frozenset(OUTCOMES)


async def set_action_status(
    db: Db,
    *,
    action_id: str,
    status: ActionStatus,
    only_from: Sequence[ActionStatus],
    outcome: dict[str, Any] | None = None,
    decline_reason: str | None = None,
) -> ActionRow | None:
    """Move an action on (confirmed, declined, executed, unknown, failed, expired) from one of
    `only_from`, in one statement; the row as it now stands, or None when it was in none of
    them (another request moved it first, and that one stands)."""
    params = {
        "id": action_id,
        "status": status.value,
        "only_from": [s.value for s in only_from],
        "outcome": None if outcome is None else Jsonb(outcome),
        "decline_reason": decline_reason,
        "resolved_at": datetime.now(UTC) if status in _RESOLUTIONS else None,
    }
    return await db.row(_SET_STATUS, params, ActionRow)


# A value not given (NULL) keeps the stored one.
_SET_STATUS = f"""
    UPDATE actions SET status = %(status)s,
        outcome = COALESCE(CAST(%(outcome)s AS jsonb), outcome),
        decline_reason = COALESCE(%(decline_reason)s, decline_reason),
        resolved_at = COALESCE(%(resolved_at)s, resolved_at)
    WHERE id = %(id)s AND status = ANY(%(only_from)s)
    RETURNING {ActionRow.COLUMNS}
"""


async def get_action(db: Db, *, action_id: str) -> ActionRow | None:
    """The action as it stands now."""
    return await db.row(_ACTION, {"id": action_id}, ActionRow)


_ACTION = f"SELECT {ActionRow.COLUMNS} FROM actions WHERE id = %(id)s"


@dataclass(frozen=True)
class ToSend:
    """A confirmed action as the send reads it: the row, and whether its tenant's assistant
    is paused (a paused tenant sends nothing)."""

    action: ActionRow
    paused: bool


async def action_to_send(db: Db, *, action_id: str) -> ToSend | None:
    """The action and its tenant's switch, in one statement; None for an unknown id."""
    return await db.made(_TO_SEND, {"id": action_id}, _to_send)


def _to_send(*, paused: bool | None, **columns: Any) -> ToSend:
    return ToSend(ActionRow(**columns), bool(paused))


_TO_SEND = f"""
    SELECT {ActionRow.COLUMNS}, (SELECT paused FROM tenants WHERE id = a.tenant_id) AS paused
    FROM actions a WHERE id = %(id)s
"""


async def latest_action(db: Db, *, turn_id: str) -> ActionRow | None:
    """The turn's most recent action, if it proposed any."""
    return await db.row(_LATEST, {"turn_id": turn_id}, ActionRow)


_LATEST = f"""
    SELECT {ActionRow.COLUMNS} FROM actions WHERE turn_id = %(turn_id)s
    ORDER BY created_at DESC LIMIT 1
"""


async def actions_in(db: Db, *, turn_id: str, statuses: Sequence[ActionStatus]) -> list[ActionRow]:
    """The turn's actions in any of these statuses."""
    params = {"turn_id": turn_id, "statuses": [s.value for s in statuses]}
    return await db.rows(_ACTIONS_IN, params, ActionRow)


_ACTIONS_IN = f"""
    SELECT {ActionRow.COLUMNS} FROM actions
    WHERE turn_id = %(turn_id)s AND status = ANY(%(statuses)s)
    ORDER BY created_at
"""


# --- the decisions' outbox: a user's decision delivered to the turn that waits for it -------


@dataclass(frozen=True)
class DecidedAction:
    """A user's decision not yet delivered to its turn (dispatch/control.py), and whether the
    turn has ended meanwhile (then nobody is left to take it)."""

    id: str
    turn_id: str
    status: str
    decline_reason: str | None
    turn_ended: bool  # never for a renewal: its turn ended before it was made
    # A renewed card: its own workflow takes the decision (a closed one says so on delivery).
    renewed: bool = False


async def undelivered_decisions(
    db: Db, *, older_than: timedelta, limit: int = 50
) -> list[DecidedAction]:
    """Confirmations and declines made more than `older_than` ago and never marked delivered,
    oldest first. A send that has begun moves the action on (executed, unknown, failed), so
    only decisions no send has acted on are here."""
    params = {
        "cutoff": datetime.now(UTC) - older_than,
        "terminal": sorted(s.value for s in TERMINAL_TURN_STATES),
        "limit": limit,
    }
    return await db.rows(_UNDELIVERED, params, DecidedAction)


# The predicate as the partial index `ix_actions_undelivered` spells it (literal statuses).
_UNDELIVERED = """
    SELECT a.id, a.turn_id, a.status, a.decline_reason,
        t.state = ANY(%(terminal)s) AND a.renewed_from IS NULL AS turn_ended,
        a.renewed_from IS NOT NULL AS renewed
    FROM actions a JOIN turns t ON t.id = a.turn_id
    WHERE a.decision_delivered_at IS NULL
        AND a.status IN ('confirmed', 'declined', 'superseded')
        AND a.resolved_at < %(cutoff)s
    ORDER BY a.resolved_at LIMIT %(limit)s
"""


async def mark_decision_delivered(db: Db, *, action_id: str) -> None:
    """The decision reached its turn (or its turn has ended): the sweep leaves it alone."""
    params = {"id": action_id, "now": datetime.now(UTC)}
    await db.run(_DECISION_DELIVERED, params)


_DECISION_DELIVERED = """
    UPDATE actions SET decision_delivered_at = %(now)s
    WHERE id = %(id)s AND decision_delivered_at IS NULL
"""


async def supersede(db: Db, *, action: ActionRow) -> None:
    """The user moved on from a pending card (a new message, an edit): it is superseded, and
    the session's log told; an action no longer pending is left as it is."""
    updated = await set_action_status(
        db, action_id=action.id, status=ActionStatus.superseded, only_from=(ActionStatus.pending,)
    )
    if updated is not None:
        await announce_resolution(db, action=updated)
