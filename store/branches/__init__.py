"""A session's branches: edit a user message or regenerate an answer into a new version,
switch between versions, and the active path every read of the conversation follows.

The model (store/models/branches.py): a session is a tree of messages. Branch 0 is the
conversation as first written; an edit or a regenerate forks the next branch from the active
one at a seq (`fork_seq`: the first message of the parent's path the new branch does not
share) and makes it the session's active branch. New messages and turns join the active
branch (store/messages.py `MESSAGE_AT_SEQ`, store/turn_states.py `BORN`, store/turns/birth.py
and store/imports.py read it from the session's row in their own statement). A branch's path
is its own messages and, recursively, its parent's path below its fork seq.

The active path is kept materialised: `off_path` on messages, result sets and summary
versions marks what it leaves out, written here when the active branch changes (a fork or a
switch, both rare) and never on a plain turn, so every read of the conversation is the filter
`NOT off_path` beside `replaced_by IS NULL` and a session that never branched costs nothing
more per turn. A summary version belongs to the branch it was written on and is read only
where that branch's path and the active one agree up to its end; the rest of the memory that
is a current value (slots, pinned facts) is saved with the branch left and restored on its
return, and a new branch keeps what was set before its fork seq.

Side effects are not versioned: an action executed on a turn off the path stays executed;
`effects_elsewhere` lists them for the page and the prompt (store/context.py reads the same
subquery, `ELSEWHERE_OF_SESSION`).

Nothing here commits (see `store`): the API commits, then starts the new turn's workflow
and delivers the signal of a card superseded by the change.
"""

from __future__ import annotations

from dataclasses import dataclass

from parley.config import Limits
from parley.contracts import ResolveActionSignal, TurnState
from parley.errors import NotFound, TurnInProgress, TurnNotRetryable
from parley.live import BranchSwitchedData, SessionEventType
from parley.statuses import Decision
from parley.store import actions, handoffs, live
from parley.store.branches import path
from parley.store.branches.tree import (
    ELSEWHERE_OF_SESSION,
    BranchRow,
    Elsewhere,
    Versions,
    answer_point,
    answered_by,
    branches_of,
    edit_point,
    effects_elsewhere,
    head_of,
    last_shown,
    parse_elsewhere,
    version_of,
    versions,
)
from parley.store.db import Db
from parley.store.identity import Identity
from parley.store.messages import MESSAGE, MessageRow
from parley.store.posting import (
    PostedMessage,
    _admit,
    _earlier_post,
    _may_use_assistant,
)
from parley.store.sessions import SessionRow, get_turn, lock_session
from parley.store.turns import birth
from parley.store.turns.reads import PostedTurn, turn_facts
from parley.wire import MessageView

__all__ = [
    "ELSEWHERE_OF_SESSION",
    "Elsewhere",
    "Versions",
    "effects_elsewhere",
    "parse_elsewhere",
    "versions",
]

ROOT = 0
# Above every seq: a version with no message yet, which no fork keeps.
_ALL_SEQS = 2**31 - 1
MESSAGE_NOT_FOUND = "message not found"
VERSION_NOT_FOUND = "no such version of this message"


@dataclass(frozen=True)
class Switched:
    """The session after a switch: the branch now active, how many versions the message
    has, and the signal of a card left pending on the branch it left (superseded),
    delivered after commit."""

    branch: int
    count: int
    signals: tuple[tuple[str, ResolveActionSignal], ...] = ()


async def edit_message(
    db: Db,
    *,
    owner: Identity,
    session_id: str,
    message_id: str,
    client_message_id: str,
    text: str,
    limits: Limits | None = None,
) -> PostedMessage:
    """A new version of the user's message `message_id` (on the active path), on a new
    branch forked at it, and its turn; the earlier version and what followed it stay on
    theirs. Idempotent on `client_message_id` like a post (the same key again answers the
    first edit's turn)."""
    session = await lock_session(db, owner=owner, session_id=session_id)
    earlier, _, _ = await _earlier_post(db, owner, session_id, client_message_id, text)
    if earlier is not None:
        return earlier
    _may_use_assistant(owner)
    edited = await _shown_message(db, session_id=session_id, message_id=message_id)
    if edited.role != "user":
        raise NotFound("only a message the user wrote can be edited")
    superseded = await _free(db, session)
    await _admit(db, owner=owner, limits=limits, locked=True)
    branches = await branches_of(db, session_id=session_id)
    head = head_of(branches, edited.id)
    point = head.point if head is not None and head.point else edit_point(edited.id)
    signals = await _supersede_card(db, superseded)
    new = await _fork(
        db, session, branches, fork_seq=edited.seq, point=point, keep_before=edited.seq
    )
    message, turn_id = await birth.insert_message_and_turn(
        db,
        session_id=session_id,
        last_seq=session.last_seq,
        owner=owner,
        client_message_id=client_message_id,
        text=text,
        attached=[],
    )
    await db.run(_HEAD, {"session_id": session_id, "number": new, "head": message.id})
    await _announce(db, session_id, new)
    turn = PostedTurn(turn_id, session_id, owner.tenant_id, owner.user_id, TurnState.received)
    return PostedMessage(turn, message, True, start=True, signals=signals)


async def regenerate(
    db: Db,
    *,
    owner: Identity,
    session_id: str,
    turn_id: str,
    limits: Limits | None = None,
) -> PostedMessage:
    """Answer the user message of the finished turn `turn_id` (on the active path) again, on
    a new branch forked right after that message; the earlier answer stays on its branch."""
    session = await lock_session(db, owner=owner, session_id=session_id)
    old = await get_turn(db, owner=owner, session_id=session_id, turn_id=turn_id)
    _may_use_assistant(owner)
    if old.state not in _FINISHED:
        raise TurnNotRetryable("only a finished answer can be regenerated", state=old.state)
    asked = await db.row(MESSAGE, {"id": old.user_message_id}, MessageRow)
    shown = await _is_shown(db, session_id=session_id, message_id=old.user_message_id)
    if asked is None or not shown:  # forgotten, or on another version of the conversation
        raise NotFound("this turn's message is not in the conversation shown")
    superseded = await _free(db, session)
    await _admit(db, owner=owner, limits=limits)  # only a regenerate that can run is counted
    branches = await branches_of(db, session_id=session_id)
    signals = await _supersede_card(db, superseded)
    # The answer's slots and facts go with it: the new turn reads the message afresh.
    point = answer_point(asked.id)
    new = await _fork(
        db, session, branches, fork_seq=asked.seq + 1, point=point, keep_before=asked.seq
    )
    turn = await birth.open_turn(db, session_id=session_id, owner=owner, message=asked)
    await db.run(_HEAD, {"session_id": session_id, "number": new, "head": turn.id})
    await _announce(db, session_id, new)
    return PostedMessage(turn, MessageView.from_row(asked), True, start=True, signals=signals)


_FINISHED = frozenset(
    {TurnState.completed, TurnState.failed, TurnState.cancelled, TurnState.expired}
)
_HEAD = """
    UPDATE branches SET head = %(head)s WHERE session_id = %(session_id)s AND number = %(number)s
"""


async def switch_version(
    db: Db, *, owner: Identity, session_id: str, message_id: str, version: int
) -> Switched:
    """Show version `version` of the message `message_id` (on the active path): a branch
    that shows it becomes the active one, the one of them shown last (the conversation as
    the user left that version). Showing the version already shown changes nothing."""
    session = await lock_session(db, owner=owner, session_id=session_id)
    message = await _shown_message(db, session_id=session_id, message_id=message_id)
    branches = await branches_of(db, session_id=session_id)
    answered = await answered_by(db, [message])
    point, shown = version_of(branches, message, answered)
    siblings = [b for b in branches.values() if b.point == point]
    count = len(siblings) + 1
    if version == shown:
        return Switched(session_branch(session), count)
    if not 1 <= version <= count:
        raise NotFound(VERSION_NOT_FOUND)
    superseded = await _free(db, session)
    # The first version is shown on the branch its second was forked from (where it starts
    # at that fork's seq); any other on its own branch, from that branch's first message.
    wanted = version if version > 1 else 2
    forked = next(b for b in siblings if b.version == wanted)
    if version > 1:
        shown_on, from_seq = forked.number, forked.first_seq or _ALL_SEQS
    else:
        assert forked.parent is not None and forked.fork_seq is not None  # a fork's
        shown_on, from_seq = forked.parent, forked.fork_seq
    target = last_shown(branches, shown_on, from_seq)
    signals = await _supersede_card(db, superseded)
    await path.save(db, session_id=session_id, number=session_branch(session))
    await path.restore(db, session_id=session_id, number=target)
    await path.activate(db, session_id=session_id, branches=branches, leaf=target)
    await _announce(db, session_id, target)
    return Switched(target, count, signals)


async def _announce(db: Db, session_id: str, branch: int) -> None:
    """Every tab of the session reads the conversation again (the session stream)."""
    switched = BranchSwitchedData(branch=branch)
    await live.announce(
        db, session_id=session_id, type=SessionEventType.branch_switched, data=switched
    )


def session_branch(session: SessionRow) -> int:
    """The session's active branch, as its row was read under its lock."""
    return session.branch


@dataclass(frozen=True)
class _Shown:
    id: str
    seq: int
    role: str
    turn_id: str | None


async def _shown_message(db: Db, *, session_id: str, message_id: str) -> _Shown:
    """A message of the session on its active path, or NotFound."""
    found = await db.row(_SHOWN, {"id": message_id, "session_id": session_id}, _Shown)
    if found is None:
        raise NotFound(MESSAGE_NOT_FOUND)
    return found


async def _is_shown(db: Db, *, session_id: str, message_id: str) -> bool:
    return await db.row(_SHOWN, {"id": message_id, "session_id": session_id}, _Shown) is not None


_SHOWN = """
    SELECT id, seq, role, turn_id FROM messages
    WHERE id = %(id)s AND session_id = %(session_id)s AND NOT off_path AND replaced_by IS NULL
"""


async def _free(db: Db, session: SessionRow) -> actions.ActionRow | None:
    """Whether the session may change versions now: no turn running or queued. A turn
    resting on its card may be left; the card is returned, to be superseded. Not while a
    person holds the session (`HandoffOpen`)."""
    await handoffs.refuse_while_held(db, session_id=session.id)
    if session.queued_turn_id is not None or session.active_turn_id is None:
        if session.queued_turn_id is not None:
            raise TurnInProgress(
                "a message waits for this session's turn", active_turn_id=session.active_turn_id
            )
        return None
    active = await turn_facts(db, turn_id=session.active_turn_id)
    assert active is not None
    card = await actions.pending_action(db, session_id=session.id)
    if active.state == TurnState.awaiting_confirmation and card and card.turn_id == active.id:
        return card
    raise TurnInProgress("a turn is still running in this session", active_turn_id=active.id)


async def _supersede_card(
    db: Db, card: actions.ActionRow | None
) -> tuple[tuple[str, ResolveActionSignal], ...]:
    """A card left pending on the branch the session leaves is superseded; its turn is told
    after commit, and ends."""
    if card is None:
        return ()
    await actions.supersede(db, action=card)
    return ((card.turn_id, ResolveActionSignal(card.id, Decision.superseded)),)


async def _fork(
    db: Db,
    session: SessionRow,
    branches: dict[int, BranchRow],
    *,
    fork_seq: int,
    point: str,
    keep_before: int,
) -> int:
    """Open the session's next branch from its active one at `fork_seq` and make it active:
    the branch left keeps its slots and pinned facts, the new one what was set before the
    seq `keep_before`. Returns its number."""
    parent = session_branch(session)
    number = max([ROOT, *branches]) + 1
    # The first version is on the parent's path; the forks of this point are 2, 3…
    version = 2 + sum(1 for b in branches.values() if b.point == point)
    if ROOT not in branches:
        await db.run(_ROOT, {"session_id": session.id})
        branches = {**branches, ROOT: BranchRow(ROOT, None, None, None, 1, None)}
    await path.save(db, session_id=session.id, number=parent)
    row = BranchRow(number, parent, fork_seq, point, version, None)
    await db.run(_NEW_BRANCH, {"session_id": session.id, **vars(row)})
    await path.keep_before(db, session_id=session.id, seq=keep_before)
    await path.activate(db, session_id=session.id, branches={**branches, number: row}, leaf=number)
    return number


_ROOT = """
    INSERT INTO branches (session_id, number, version) VALUES (%(session_id)s, 0, 1)
    ON CONFLICT DO NOTHING
"""
_NEW_BRANCH = """
    INSERT INTO branches (session_id, number, parent, fork_seq, point, version, head)
    VALUES (%(session_id)s, %(number)s, %(parent)s, %(fork_seq)s, %(point)s, %(version)s,
        %(head)s)
"""
