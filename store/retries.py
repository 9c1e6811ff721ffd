"""Retrying a turn: a failed or cancelled answer asked again, once, as a new turn for the same
user message (`POST .../turns/{turn_id}/retry`). The turn is opened as a post opens one
(store/turns/birth.py `open_turn`, after the same access check and admission); nothing here
commits (see `store`): the API commits the new turn, its start outbox, then starts it."""

from __future__ import annotations

from dataclasses import dataclass

from parley.config import Limits
from parley.contracts import MessageStatus, TurnState
from parley.errors import TurnInProgress, TurnNotRetryable
from parley.store import handoffs
from parley.store.db import Db
from parley.store.identity import Identity
from parley.store.messages import MESSAGE, MessageRow
from parley.store.posting import PostedMessage, _admit, _may_use_assistant
from parley.store.sessions import get_turn, lock_session
from parley.store.turns.birth import open_turn
from parley.wire import MessageView


async def retry_turn(
    db: Db,
    *,
    owner: Identity,
    session_id: str,
    turn_id: str,
    limits: Limits | None = None,
) -> PostedMessage:
    """Open a new turn for the same user message; its answer will replace the failed one.
    The old turn stays as it ended: a finished turn never moves again. The API starts the
    new turn after commit."""
    session = await lock_session(db, owner=owner, session_id=session_id)
    old = await get_turn(db, owner=owner, session_id=session_id, turn_id=turn_id)
    _may_use_assistant(owner)
    facts = await db.row(_RETRY_FACTS, {"turn_id": old.id}, _RetryFacts)
    assert facts is not None  # a select list without FROM: always one row
    retryable = old.state in (TurnState.failed, TurnState.cancelled) and (
        facts.answer_status in (None, MessageStatus.incomplete, MessageStatus.cancelled)
    )
    # One retry per turn: a retry that failed in turn is retried itself, never the original.
    if not retryable or facts.retried:
        raise TurnNotRetryable("only a failed or cancelled answer can be retried", state=old.state)
    if session.active_turn_id is not None:
        raise TurnInProgress(
            "a turn is still running in this session", active_turn_id=session.active_turn_id
        )
    await handoffs.refuse_while_held(db, session_id=session_id)
    await _admit(db, owner=owner, limits=limits)  # only a retry that can run is counted
    asked = await db.row(MESSAGE, {"id": old.user_message_id}, MessageRow)
    if asked is None:  # the user forgot it (store/lifecycle/forget.py): nothing to answer again
        raise TurnNotRetryable("the message this turn answered was forgotten", state=old.state)
    turn = await open_turn(db, session_id=session_id, owner=owner, message=asked, retry_of=old.id)
    return PostedMessage(turn, MessageView.from_row(asked), True, start=True)


@dataclass(frozen=True)
class _RetryFacts:
    # The status of the turn's answer (None: it has none, or it was forgotten).
    answer_status: str | None
    # Whether the turn was retried already.
    retried: bool


_RETRY_FACTS = """
    SELECT (SELECT m.status FROM messages AS m JOIN turns AS t ON m.id = t.assistant_message_id
            WHERE t.id = %(turn_id)s) AS answer_status,
        EXISTS (SELECT 1 FROM turns WHERE retry_of = %(turn_id)s) AS retried
"""
