"""The rows a context build reads in every phase, loaded together at its start.

The session's identity map keeps only referenced objects; the build holds these for its whole
run, so each later `db.get` of them (the tool offer, the state block, the knowledge check,
the tenant's configuration) is answered from memory instead of by another round trip.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from store.models import ChatSession, Message, ModelCall, Tenant, Turn, User


async def hold_turn_rows(db: AsyncSession, turn: Turn, step: int) -> Sequence[Any] | None:
    """The turn's user message, user, session and tenant, and the step's model call if an
    earlier attempt stored it: loaded once and in one statement. None when
    the message is missing (each later `db.get` then reads on its own)."""
    user = (User.tenant_id == turn.tenant_id) & (User.id == turn.user_id)
    call = (ModelCall.turn_id == turn.id) & (ModelCall.step == step)
    held = await db.execute(
        select(Message, User, ChatSession, Tenant, ModelCall)
        .select_from(Message)
        .outerjoin(User, user)
        .outerjoin(ChatSession, ChatSession.id == turn.session_id)
        .outerjoin(Tenant, Tenant.id == turn.tenant_id)
        .outerjoin(ModelCall, call)
        .where(Message.id == turn.user_message_id)
    )
    return held.one_or_none()


async def packed_before(
    db: AsyncSession, turn: Turn, step: int, held: Sequence[Any] | None
) -> ModelCall | None:
    """The step's model call an earlier attempt stored, if any."""
    if held is not None:
        return cast(ModelCall | None, held[-1])
    return await db.scalar(
        select(ModelCall).where(ModelCall.turn_id == turn.id, ModelCall.step == step)
    )
