"""Hand-offs code opens, not the model (the rules: parley/handoff_rules.py): a customer's
message that plainly asks for a person (the POST, store/posting.py) and a tenant's policy as
a turn ends (activities/handoffs.py), with what that policy counts in a session.

A case opened here is a `handoffs` row like the model's (store/handoffs.py owns the row, its
moves and its log; this module composes its `OPEN_CASE`), and the customer is told in the
words a model-opened case gives (`OPENED_TEXT`). Locks as in store/handoffs.py: the session's
row first. Nothing here commits (see `store`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from parley.handoff_rules import HandoffRules, OpenedBy, asked_reason
from parley.handoffs import OPENED_TEXT
from parley.ids import new_id
from parley.store.db import Db
from parley.store.handoffs import (
    LOCK_SESSION_BY_ID,
    OPEN_CASE,
    HandoffRow,
    add_message,
    announce_status,
    from_customer,
    get_case,
)
from parley.wire import MessageView


async def open_asked(
    db: Db, *, session_id: str, text: str, client_message_id: str, rules: HandoffRules
) -> Opened | None:
    """The customer asked for a person (`text`, their message): the case opens with it as
    its first message. The caller holds the session's row and found no case open."""
    return await open_by_code(
        db,
        handoff_id=new_id("hof"),
        session_id=session_id,
        turn_id=None,
        by=OpenedBy.user_asked,
        reason=asked_reason(text),
        priority=rules.priority(OpenedBy.user_asked, text),
        asked=(text, client_message_id),
    )


async def open_by_code(
    db: Db,
    *,
    handoff_id: str,
    session_id: str,
    turn_id: str | None,
    by: OpenedBy,
    reason: str,
    priority: int,
    asked: tuple[str, str] | None = None,
) -> Opened | None:
    """A case code opens (the customer's words, a tenant's policy), the customer told in the
    words a model-opened case uses (`OPENED_TEXT`); `asked`: the customer's message (its text
    and `client_message_id`) that asked for a person, stored first, as the case's. The caller
    holds the session's row. None when another case holds the session already (or this one,
    opened by an earlier attempt, has ended)."""
    params = {
        "id": handoff_id,
        "session_id": session_id,
        "turn_id": turn_id,
        "reason": reason,
        "priority": priority,
        "by": by.value,
    }
    opened = await db.row(OPEN_CASE, params, HandoffRow)
    if opened is None:  # one is open, or this very one was opened by an earlier attempt
        earlier = await get_case(db, handoff_id=handoff_id)
        return Opened(earlier, None, new=False) if earlier is not None and earlier.open else None
    await announce_status(db, case=opened)
    message = None
    if asked is not None:
        message = await from_customer(db, case=opened, text=asked[0], key=asked[1])
    await add_message(db, case=opened, role="assistant", text=OPENED_TEXT)
    return Opened(opened, message, new=True)


@dataclass(frozen=True)
class Opened:
    """A case `open_by_code` opened, or found opened by an earlier attempt (`new`: False)."""

    case: HandoffRow
    asked: MessageView | None  # the customer's message that asked for a person
    new: bool


@dataclass(frozen=True)
class PolicySeen:
    """What a tenant's hand-off policy looks at in a session, since its last case opened."""

    busy: bool  # a turn is active or queued: the next turn's end looks again
    tenant_config: dict[str, Any]
    outages: int  # its latest ended tool calls in a row that found the system down (<= 50)
    retractions: int  # answers the output screen withdrew


async def policy_seen(db: Db, *, session_id: str) -> PolicySeen | None:
    """The session's state, its tenant's configuration, its tool outages in a row and its
    retracted answers (both since its last case opened: a case a person ended starts over),
    in one statement and unlocked: every turn's end reads it, and only a session the policy
    would hand over is locked and read again. None when the session is gone."""
    return await db.made(_POLICY_SEEN, {"session_id": session_id}, _seen)


def _seen(*, tenant_config: dict[str, Any] | None, **seen: Any) -> PolicySeen:
    return PolicySeen(**seen, tenant_config=dict(tenant_config or {}))


# `outages` counts from the latest ended call back to the first that did not find the system
# down (a running AND over the calls, newest first), at most the 50 a tenant may ask for.
_POLICY_SEEN = """
    WITH since AS (
        SELECT coalesce(max(created_at), '-infinity') AS t FROM handoffs
        WHERE session_id = %(session_id)s
    )
    SELECT
        (s.active_turn_id IS NOT NULL OR s.queued_turn_id IS NOT NULL) AS busy,
        tn.config AS tenant_config,
        (SELECT count(*) FROM (
            SELECT bool_and(coalesce(tc.result -> 'error' ->> 'code' = 'unavailable', false))
                OVER (ORDER BY tc.created_at DESC, tc.id DESC) AS all_down
            FROM tool_calls AS tc JOIN turns AS t ON t.id = tc.turn_id
            WHERE t.session_id = %(session_id)s AND tc.status <> 'pending'
                AND tc.created_at > (SELECT t FROM since)
            ORDER BY tc.created_at DESC, tc.id DESC LIMIT 50) AS recent
         WHERE recent.all_down) AS outages,
        (SELECT count(*) FROM messages
         WHERE session_id = %(session_id)s AND status = 'retracted'
            AND created_at > (SELECT t FROM since)) AS retractions
    FROM sessions AS s LEFT JOIN tenants AS tn ON tn.id = s.tenant_id
    WHERE s.id = %(session_id)s
"""


async def lock_session_row(db: Db, *, session_id: str) -> bool:
    """The session's row locked first (the module's lock order), for a writer that starts
    from a session id with no owner to check (a turn's ending). Whether it exists."""
    return await db.value(LOCK_SESSION_BY_ID, {"session_id": session_id}) is not None
