"""The rows a context build reads in every phase, loaded together at its start.

The session's identity map keeps only referenced objects; the build holds these for its whole
run, so each later `db.get` of them (the tool offer, the state block, the knowledge check,
the tenant's configuration) is answered from memory instead of by another round trip.
Also the session's memory and recent messages, which the packing reads once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from parley.context import WindowMessage
from parley.prompt import Memory
from parley.resolver import PENDING_CLARIFICATION, Slot
from parley.tokens import TokenCounter
from store import memory as memory_store
from store.models import ChatSession, Message, ModelCall, Tenant, Turn, User


async def turn_with_rows(
    db: AsyncSession, turn_id: str, step: int, *, lock: bool
) -> tuple[Turn, Sequence[Any] | None]:
    """The turn (its row locked, with `lock`) and the rows every phase reads: its user
    message, user, session and tenant, and the step's model call if an earlier attempt stored
    it, all in one statement. The rows are None when the message is missing (each later
    `db.get` then reads on its own)."""
    user = (User.tenant_id == Turn.tenant_id) & (User.id == Turn.user_id)
    call = (ModelCall.turn_id == Turn.id) & (ModelCall.step == step)
    statement = (
        select(Turn, Message, User, ChatSession, Tenant, ModelCall)
        .select_from(Turn)
        .outerjoin(Message, Message.id == Turn.user_message_id)
        .outerjoin(User, user)
        .outerjoin(ChatSession, ChatSession.id == Turn.session_id)
        .outerjoin(Tenant, Tenant.id == Turn.tenant_id)
        .outerjoin(ModelCall, call)
        .where(Turn.id == turn_id)
    )
    if lock:
        statement = statement.with_for_update(of=Turn)
    found = (await db.execute(statement)).one_or_none()
    if found is None:
        raise LookupError(turn_id)
    turn, *held = found
    return turn, (held if held[0] is not None else None)


async def packed_before(
    db: AsyncSession, turn: Turn, step: int, held: Sequence[Any] | None
) -> ModelCall | None:
    """The step's model call an earlier attempt stored, if any."""
    if held is not None:
        return cast(ModelCall | None, held[-1])
    return await db.scalar(
        select(ModelCall).where(ModelCall.turn_id == turn.id, ModelCall.step == step)
    )


async def window_messages(
    db: AsyncSession, turn: Turn, summary_through: int | None, counter: TokenCounter
) -> list[WindowMessage]:
    """The session's messages from where the window may start (after the summary, or wider
    when the summary lags), a retried turn's earlier answers hidden."""
    return await memory_store.session_messages(
        db,
        session_id=turn.session_id,
        after_seq=memory_store.window_start_clause(
            session_id=turn.session_id, summary_through=summary_through
        ),
        hide_answers_of=turn.retry_of,
        counter=counter,
    )


async def session_memory(db: AsyncSession, turn: Turn, current: dict[str, Slot]) -> Memory:
    """The session's summary, pinned facts and slots (slots outrank summary lines)."""
    summary, facts = await memory_store.summary_and_facts(db, session_id=turn.session_id)
    return Memory(
        summary=summary,
        facts=facts,
        slots={
            k: (v.value, v.set_at_seq) for k, v in current.items() if k != PENDING_CLARIFICATION
        },
    )
