"""Confirm or decline a pending action: the user's own, bound answer to one proposal; and ask
again for one that expired (parley/approvals.py)."""

from __future__ import annotations

from datetime import timedelta

from fastapi import APIRouter

from parley.api.delivery import start_renewal_soon
from parley.api.deps import AppSettings, AutocommitSessions, CurrentUser, DbSession, Temporal
from parley.api.errors import answers
from parley.api.posting import answer_card
from parley.api.schemas import ActionOut
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
from parley.store import approvals, tenants
from parley.store import sessions as store_sessions
from parley.wire import ActionView

router = APIRouter(
    prefix="/v1/sessions/{session_id}/actions",
    tags=["confirmations"],
    responses=answers(
        NotFound, ActionResolved, ActionSuperseded, ActionExpired, ActionChanged, AgentPaused
    ),
)


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
    return await answer_card(
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
    return await answer_card(
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
