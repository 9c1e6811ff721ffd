"""A specialist's questions to the user, read back from the turn's event log.

The `interaction` event is the record of a question (its id and options); there is no other
row. Posting a message while the session's turn rests in `awaiting_input` answers the last
question asked: the message joins that turn and its answer, a `specialist_answers` row (the
delivery outbox, dispatch/specialists.py), is delivered to the specialist. Nothing here
commits (see `store`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncSession

from parley.contracts import EventType, InteractionAnswer, TurnState
from parley.ids import new_id
from parley.specialists import match_option
from parley.store.models import SpecialistAnswer, Turn, TurnEvent
from parley.store.rows import typed_row
from parley.wire import InteractionData


@dataclass(frozen=True)
class AnswerRow:
    """A user's answer to a specialist's question, in the delivery outbox."""

    id: str
    turn_id: str
    interaction_id: str
    value: str


async def has_event(
    db: AsyncSession, *, turn_id: str, type_: EventType, key: str, value: str
) -> bool:
    """Whether the turn's log holds an event of this type whose `key` field is `value`."""
    found = await db.scalar(
        select(TurnEvent.id)
        .where(
            TurnEvent.turn_id == turn_id,
            TurnEvent.type == type_,
            TurnEvent.data[key].astext == value,
        )
        .limit(1)
    )
    return found is not None


async def open_interaction(db: AsyncSession, *, turn_id: str) -> InteractionData | None:
    """The question the turn's specialist asked last, or None."""
    data = await db.scalar(
        select(TurnEvent.data)
        .where(TurnEvent.turn_id == turn_id, TurnEvent.type == EventType.interaction)
        .order_by(TurnEvent.id.desc())
        .limit(1)
    )
    return InteractionData.model_validate(data) if data is not None else None


async def answer_for_waiting_turn(
    db: AsyncSession, *, active_turn_id: str | None, text: str, value: str | None
) -> tuple[Turn, InteractionAnswer] | None:
    """When the session's active turn waits for the user's answer: that turn and the answer
    (a clicked option's `value`, else the option the text names, else "": the specialist
    asks again). None when the active turn is not waiting for an answer."""
    if active_turn_id is None:
        return None
    active = await db.get(Turn, active_turn_id)
    if active is None or active.state != TurnState.awaiting_input:
        return None
    asked = await open_interaction(db, turn_id=active.id)
    if asked is None:
        return None
    values = {o.value for o in asked.options}
    chosen = value if value in values else match_option(text, asked.options)
    return active, InteractionAnswer(asked.interaction_id, chosen or "")


async def record_answer(db: AsyncSession, *, turn_id: str, answer: InteractionAnswer) -> AnswerRow:
    """The answer as an outbox row, committed with the user's message before any signal."""
    row = SpecialistAnswer(
        id=new_id("ans"),
        turn_id=turn_id,
        interaction_id=answer.interaction_id,
        value=answer.value,
    )
    db.add(row)
    await db.flush()
    return typed_row(AnswerRow, row)


async def mark_answer_delivered(db: AsyncSession, *, answer_id: str) -> None:
    await db.execute(
        update(SpecialistAnswer)
        .where(SpecialistAnswer.id == answer_id, SpecialistAnswer.delivered_at.is_(None))
        .values(delivered_at=datetime.now(UTC))
    )


async def undelivered_answers(
    db: AsyncSession, *, older_than: timedelta, limit: int = 50
) -> list[AnswerRow]:
    """Answers committed more than `older_than` ago and never marked delivered, oldest
    first."""
    cutoff = datetime.now(UTC) - older_than
    rows = await db.scalars(
        select(SpecialistAnswer)
        .where(SpecialistAnswer.delivered_at.is_(None), SpecialistAnswer.created_at < cutoff)
        .order_by(SpecialistAnswer.created_at)
        .limit(limit)
    )
    return [typed_row(AnswerRow, row) for row in rows]
