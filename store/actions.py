"""Pending actions (proposal, confirmation, execution) and hand-offs to a person.

A confirmation is a conditional update (`… WHERE status = 'pending'`), so two confirms that
race execute once: exactly one of them sees its row change. Rows a tool call creates are
inserted with an id derived from the call (`… ON CONFLICT DO NOTHING`), so a retried attempt
finds the row the first one wrote, and a row found under that id must belong to the same
session, tenant and user. Everything here runs in the caller's transaction (see `store`).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession

from parley.contracts import EventType
from parley.errors import ActionChanged, ActionExpired, ActionResolved, NotFound
from parley.statuses import ActionStatus, Decision
from parley.tools import args_hash
from parley.wire import ActionData, ActionView
from store.events import append_event
from store.identity import Identity
from store.models import Action, Handoff, Turn
from store.turn_rows import TurnFacts
from store.turns import lock_running

ACTION_NOT_FOUND = "action not found"


class ForeignRow(Exception):
    """A derived id already names a row of another session, tenant or user: a bug, never
    something to hand back."""


async def create_action(
    db: AsyncSession,
    *,
    turn: Turn | TurnFacts,
    action_id: str,
    tool: str,
    args: dict[str, Any],
    summary: str,
    recipient_masked: str | None,
    ttl: timedelta,
) -> Action:
    """The proposal's pending action, once: a retried attempt gets the row the first wrote.
    A turn that ended or is being cancelled gets none (`TurnStopped`): no card outlives a Stop."""
    session_id, turn_id, tenant_id, user_id = turn.session_id, turn.id, turn.tenant_id, turn.user_id
    await lock_running(db, turn_id=turn_id)
    await db.execute(
        insert(Action)
        .values(
            id=action_id,
            session_id=session_id,
            turn_id=turn_id,
            tenant_id=tenant_id,
            user_id=user_id,
            tool=tool,
            args=args,
            args_hash=args_hash(tool, args),
            summary=summary,
            recipient_masked=recipient_masked,
            status=ActionStatus.pending,
            expires_at=datetime.now(UTC) + ttl,
        )
        .on_conflict_do_nothing(index_elements=[Action.id])
    )
    action = await db.get(Action, action_id, populate_existing=True)
    assert action is not None
    owner = (action.session_id, action.turn_id, action.tenant_id, action.user_id)
    if owner != (session_id, turn_id, tenant_id, user_id):
        raise ForeignRow(f"action {action_id} belongs to another turn")
    return action


async def create_handoff(
    db: AsyncSession, *, handoff_id: str, session_id: str, turn_id: str, reason: str
) -> Handoff:
    """The hand-off a tool call asked for, once however often the call runs."""
    await db.execute(
        insert(Handoff)
        .values(id=handoff_id, session_id=session_id, turn_id=turn_id, reason=reason)
        .on_conflict_do_nothing(index_elements=[Handoff.id])
    )
    handoff = await db.get(Handoff, handoff_id, populate_existing=True)
    assert handoff is not None
    if (handoff.session_id, handoff.turn_id) != (session_id, turn_id):
        raise ForeignRow(f"hand-off {handoff_id} belongs to another turn")
    return handoff


async def pending_action(db: AsyncSession, *, session_id: str) -> Action | None:
    return await db.scalar(
        select(Action)
        .where(Action.session_id == session_id, Action.status == ActionStatus.pending)
        .order_by(Action.created_at.desc())
        .limit(1)
    )


async def resolve_action(
    db: AsyncSession,
    *,
    action_id: str,
    session_id: str,
    owner: Identity | None,
    decision: Decision,
    reason: str | None = None,
) -> Action:
    """Confirm or decline a pending action for its own user; raise the contract's conflicts.

    Appends `confirmation_resolved` to the turn. An action whose window has passed is stored
    `expired` before `ActionExpired` is raised: the caller commits that, then answers.
    """
    query = select(Action).where(Action.id == action_id, Action.session_id == session_id)
    if owner is not None:
        query = query.where(Action.tenant_id == owner.tenant_id, Action.user_id == owner.user_id)
    action = await db.scalar(query.with_for_update())
    if action is None:
        raise NotFound(ACTION_NOT_FOUND)
    if action.status == ActionStatus.expired:
        raise ActionExpired("the confirmation window has passed", action=_shown(action))
    if action.status != ActionStatus.pending:
        raise ActionResolved(f"the action is already {action.status}", action=_shown(action))
    if action.expires_at <= datetime.now(UTC):
        action.status = ActionStatus.expired
        action.resolved_at = datetime.now(UTC)
        await db.flush()
        await announce_resolution(db, action=action)
        raise ActionExpired("the confirmation window has passed", action=_shown(action))
    if decision == Decision.confirmed and args_hash(action.tool, action.args) != action.args_hash:
        raise ActionChanged("the action changed after it was shown; nothing was sent")
    changed = await db.execute(
        update(Action)
        .where(Action.id == action_id, Action.status == ActionStatus.pending)
        .values(status=decision, decline_reason=reason, resolved_at=datetime.now(UTC))
    )
    if changed.rowcount != 1:  # type: ignore[attr-defined]
        raise ActionResolved("the action is already resolved")
    await db.refresh(action)
    await announce_resolution(db, action=action)
    return action


async def announce_resolution(db: AsyncSession, *, action: Action) -> None:
    """Tell the turn's stream how its confirmation ended (`confirmation_resolved`)."""
    await append_event(
        db,
        turn_id=action.turn_id,
        type=EventType.confirmation_resolved,
        data=ActionData(action=ActionView.from_row(action)),
    )


def _shown(action: Action) -> dict[str, Any]:
    """The action as an error answer carries it (its `action` field)."""
    return ActionView.from_row(action).model_dump(mode="json")


async def set_action_status(
    db: AsyncSession,
    *,
    action_id: str,
    status: ActionStatus,
    outcome: dict[str, Any] | None = None,
    only_from: tuple[ActionStatus, ...] | None = None,
) -> Action | None:
    """Move an action on (executed, unknown, failed, expired); None if it was not in `only_from`."""
    query = update(Action).where(Action.id == action_id)
    if only_from:
        query = query.where(Action.status.in_(only_from))
    values: dict[str, Any] = {"status": status}
    if outcome is not None:
        values["outcome"] = outcome
    if status == ActionStatus.expired:
        values["resolved_at"] = datetime.now(UTC)
    result = await db.execute(query.values(**values).returning(Action.id))
    if result.scalar() is None:
        return None
    return await db.get(Action, action_id, populate_existing=True)


async def get_action(db: AsyncSession, *, action_id: str) -> Action | None:
    """The action (from the session's identity map when it holds it)."""
    return await db.get(Action, action_id)


async def latest_action(db: AsyncSession, *, turn_id: str) -> Action | None:
    """The turn's most recent action, if it proposed any."""
    return await db.scalar(
        select(Action).where(Action.turn_id == turn_id).order_by(Action.created_at.desc())
    )


async def actions_in(
    db: AsyncSession, *, turn_id: str, statuses: Sequence[ActionStatus]
) -> list[Action]:
    """The turn's actions in any of these statuses."""
    found = await db.scalars(
        select(Action).where(Action.turn_id == turn_id, Action.status.in_(statuses))
    )
    return list(found)
