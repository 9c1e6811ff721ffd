"""Confirm or decline a pending action: the user's own, bound answer to one proposal; and ask
again for one that expired (parley/approvals.py)."""

from __future__ import annotations

from datetime import timedelta

from fastapi import APIRouter

from parley.api.delivery import deliver_decisions, start_renewal_soon
from parley.api.deps import AppSettings, AutocommitSessions, CurrentUser, DbSession, Temporal
from parley.api.errors import answers
from parley.api.schemas import ActionOut
from parley.contracts import ResolveActionSignal
from parley.errors import (
    ActionChanged,
    ActionExpired,
    ActionNotExpired,
    ActionResolved,
    ActionSuperseded,
    AgentPaused,
    FeatureNotEnabled,
    NotFound,
)
from parley.features import ASSISTANT
from parley.statuses import Decision
from parley.store import actions, approvals, tenants
from parley.store import sessions as store_sessions
from parley.wire import ActionView

router = APIRouter(
    prefix="/v1/sessions/{session_id}/actions",
    tags=["confirmations"],
    responses=answers(
        NotFound, ActionResolved, ActionSuperseded, ActionExpired, ActionChanged, AgentPaused
    ),
)


async def _resolve(
    session_id: str,
    action_id: str,
    decision: Decision,
    db: DbSession,
    user: CurrentUser,
    temporal: Temporal,
    one_statement: AutocommitSessions,
) -> ActionOut:
    await store_sessions.get_session(db, owner=user, session_id=session_id)
    if await tenants.is_paused(db, tenant_id=user.tenant_id):
        # Fails closed: nothing is decided, the action stays pending for after the resume.
        raise AgentPaused("the assistant is paused for this tenant")
    try:
        action = await actions.resolve_action(
            db, action_id=action_id, session_id=session_id, owner=user, decision=decision
        )
    except ActionExpired:
        await db.commit()  # the action is stored expired, whatever the answer
        raise
    except ActionResolved:
        # The same answer again: its first delivery may have been lost, so deliver it again
        # (the turn takes a decision once) before answering 409.
        answered = await actions.get_action(db, action_id=action_id)
        if answered is not None and answered.status == decision:
            again = ((answered.turn_id, ResolveActionSignal(action_id, decision)),)
            await db.rollback()
            renewal = answered.renewed_from is not None
            await deliver_decisions(temporal, one_statement, again, renewal=renewal)
        raise
    await db.commit()
    decided = ((action.turn_id, ResolveActionSignal(action.id, decision)),)
    renewal = action.renewed_from is not None
    await deliver_decisions(temporal, one_statement, decided, renewal=renewal)
    return ActionOut(action=ActionView.from_row(action))


@router.post("/{action_id}/confirm", status_code=202)
async def confirm(
    session_id: str,
    action_id: str,
    db: DbSession,
    user: CurrentUser,
    temporal: Temporal,
    one_statement: AutocommitSessions,
) -> ActionOut:
    """Confirm the pending action exactly as shown; it runs once, however often this is sent."""
    return await _resolve(
        session_id, action_id, Decision.confirmed, db, user, temporal, one_statement
    )


@router.post("/{action_id}/decline", status_code=202)
async def decline(
    session_id: str,
    action_id: str,
    db: DbSession,
    user: CurrentUser,
    temporal: Temporal,
    one_statement: AutocommitSessions,
) -> ActionOut:
    """Decline the pending action; nothing is sent."""
    return await _resolve(
        session_id, action_id, Decision.declined, db, user, temporal, one_statement
    )


@router.post(
    "/{action_id}/renew",
    status_code=202,
    responses=answers(NotFound, AgentPaused, FeatureNotEnabled, ActionNotExpired),
)
async def renew(
    session_id: str,
    action_id: str,
    db: DbSession,
    user: CurrentUser,
    temporal: Temporal,
    one_statement: AutocommitSessions,
    settings: AppSettings,
) -> ActionOut:
    """Ask again for an expired card: a new card with the same action and arguments digest
    and a new expiry, no new model call; confirming it sends once. Asking twice answers the
    same card."""
    await store_sessions.get_session(db, owner=user, session_id=session_id)
    # The user as they are now, not as they were when the card was first shown.
    if ASSISTANT not in user.features:
        raise FeatureNotEnabled("the assistant is not enabled for this user", feature=ASSISTANT)
    if await tenants.is_paused(db, tenant_id=user.tenant_id):
        raise AgentPaused("the assistant is paused for this tenant")
    renewal = await approvals.renew_action(
        db,
        action_id=action_id,
        session_id=session_id,
        owner=user,
        ttl=timedelta(seconds=settings.confirmation_timeout_s),
    )
    await db.commit()
    # Idempotent: a repeated renew whose first start was lost starts it now.
    await start_renewal_soon(temporal, one_statement, settings, renewal.action)
    return ActionOut(action=ActionView.from_row(renewal.action))
