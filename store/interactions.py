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
from typing import Any

from parley.contracts import EventType, InteractionAnswer, TurnState
from parley.ids import new_id
from parley.specialists import match_option
from parley.store.db import Db
from parley.store.turns.reads import TurnFacts
from parley.wire import InteractionData


@dataclass(frozen=True)
class AnswerRow:
    """A user's answer to a specialist's question, in the delivery outbox."""

    id: str
    turn_id: str
    interaction_id: str
    value: str


_ANSWER_COLUMNS = "id, turn_id, interaction_id, value"


async def has_event(db: Db, *, turn_id: str, type_: EventType, key: str, value: str) -> bool:
    """Whether the turn's log holds an event of this type whose `key` field is `value`."""
    params = {"turn_id": turn_id, "type": type_.value, "key": key, "value": value}
    return await db.value(_HAS_EVENT, params) is not None


_HAS_EVENT = """
    SELECT id FROM turn_events
    WHERE turn_id = %(turn_id)s AND type = %(type)s AND data ->> %(key)s = %(value)s
    LIMIT 1
"""


async def open_interaction(db: Db, *, turn_id: str) -> InteractionData | None:
    """The question the turn's specialist asked last, or None."""
    data = await db.value(_LAST_ASKED, {"turn_id": turn_id, "type": EventType.interaction.value})
    return InteractionData.model_validate(data) if data is not None else None


_LAST_ASKED = """
    SELECT data FROM turn_events WHERE turn_id = %(turn_id)s AND type = %(type)s
    ORDER BY id DESC LIMIT 1
"""


async def answer_for_waiting_turn(
    db: Db, *, active: TurnFacts | None, text: str, value: str | None
) -> InteractionAnswer | None:
    """When the session's active turn (`active`, as the caller read it under the session's
    lock) waits for the user's answer: the answer (a clicked option's `value`, else the
    option the text names, else "": the specialist asks again). None when the active turn
    is not waiting for an answer."""
    if active is None or active.state != TurnState.awaiting_input:
        return None
    asked = await open_interaction(db, turn_id=active.id)
    if asked is None:
        return None
    values = {o.value for o in asked.options}
    chosen = value if value in values else match_option(text, asked.options)
    return InteractionAnswer(asked.interaction_id, chosen or "")


async def record_answer(db: Db, *, turn_id: str, answer: InteractionAnswer) -> AnswerRow:
    """The answer as an outbox row, committed with the user's message before any signal."""
    params = {
        "id": new_id("ans"),
        "turn_id": turn_id,
        "interaction_id": answer.interaction_id,
        "value": answer.value,
    }
    row = await db.row(_RECORD_ANSWER, params, AnswerRow)
    assert row is not None
    return row


_RECORD_ANSWER = f"""
    INSERT INTO specialist_answers (id, turn_id, interaction_id, value)
    VALUES (%(id)s, %(turn_id)s, %(interaction_id)s, %(value)s)
    RETURNING {_ANSWER_COLUMNS}
"""


async def mark_answer_delivered(db: Db, *, answer_id: str) -> None:
    await db.run(_DELIVERED, {"id": answer_id, "now": datetime.now(UTC)})


_DELIVERED = """
    UPDATE specialist_answers SET delivered_at = %(now)s
    WHERE id = %(id)s AND delivered_at IS NULL
"""


async def undelivered_answers(db: Db, *, older_than: timedelta, limit: int = 50) -> list[AnswerRow]:
    """Answers committed more than `older_than` ago and never marked delivered, oldest
    first."""
    params: dict[str, Any] = {"cutoff": datetime.now(UTC) - older_than, "limit": limit}
    return await db.rows(_UNDELIVERED, params, AnswerRow)


_UNDELIVERED = f"""
    SELECT {_ANSWER_COLUMNS} FROM specialist_answers
    WHERE delivered_at IS NULL AND created_at < %(cutoff)s
    ORDER BY created_at LIMIT %(limit)s
"""
