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

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from parley.config import Limits
from parley.contracts import ResolveActionSignal, TurnState
from parley.errors import NotFound, TurnInProgress, TurnNotRetryable
from parley.statuses import ActionStatus, Decision
from parley.store import actions
from parley.store.db import Db
from parley.store.identity import Identity
from parley.store.messages import MESSAGE, MessageRow
from parley.store.posting import (
    PostedMessage,
    _admit,
    _earlier_post,
    _may_use_assistant,
    _supersede,
    open_turn,
)
from parley.store.sessions import SessionRow, get_turn, lock_session
from parley.store.turns import birth
from parley.store.turns.reads import PostedTurn, turn_facts
from parley.wire import MessageView

# Above every seq (seqs are 32-bit in the store): the limit of a branch's own messages.
_ALL = 2**31 - 1
ROOT = 0
MESSAGE_NOT_FOUND = "message not found"
VERSION_NOT_FOUND = "no such version of this message"


@dataclass(frozen=True)
class BranchRow:
    number: int
    parent: int | None
    fork_seq: int | None
    point: str | None
    version: int
    head: str | None


def path_of(branches: dict[int, BranchRow], leaf: int) -> list[tuple[int, int]]:
    """The path of branch `leaf` as (branch, below seq) pairs: a message of branch `b` at
    seq `s` is on it when a pair (b, limit) has s < limit."""
    path, limit, number = [], _ALL, leaf
    while True:
        path.append((number, limit))
        row = branches.get(number)
        if row is None or row.parent is None or row.fork_seq is None:
            return path
        limit, number = min(limit, row.fork_seq), row.parent


def on_path(path: Sequence[tuple[int, int]], branch: int, seq: int) -> bool:
    return any(branch == b and seq < limit for b, limit in path)


# Points: which versions a message is one of (see store/models/branches.py `point`).
def edit_point(message_id: str) -> str:
    return f"msg:{message_id}"


def answer_point(user_message_id: str) -> str:
    return f"ans:{user_message_id}"


@dataclass(frozen=True)
class Versions:
    """A message's versions as `GET .../messages` shows them: how many, and which is shown
    (1 is the first written)."""

    count: int
    shown: int


@dataclass(frozen=True)
class Switched:
    """The session after a switch: the branch now active, how many versions the message
    has, and the signal of a card left pending on the branch it left (superseded),
    delivered after commit."""

    branch: int
    count: int
    signals: tuple[tuple[str, ResolveActionSignal], ...] = ()


async def branches_of(db: Db, *, session_id: str) -> dict[int, BranchRow]:
    rows = await db.rows(_BRANCHES, {"session_id": session_id}, BranchRow)
    return {row.number: row for row in rows}


_BRANCHES = """
    SELECT number, parent, fork_seq, point, version, head FROM branches
    WHERE session_id = %(session_id)s
"""


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
    earlier, _ = await _earlier_post(db, owner, session_id, client_message_id, text)
    if earlier is not None:
        return earlier
    _may_use_assistant(owner)
    edited = await _shown_message(db, session_id=session_id, message_id=message_id)
    if edited.role != "user":
        raise NotFound("only a message the user wrote can be edited")
    superseded = await _free(db, session)
    await _admit(db, owner=owner, limits=limits, locked=True)
    branches = await branches_of(db, session_id=session_id)
    head = _head_of(branches, edited.id)
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
    turn = await open_turn(db, session_id=session_id, owner=owner, message=asked)
    await db.run(_HEAD, {"session_id": session_id, "number": new, "head": turn.id})
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
    """Show version `version` of the message `message_id` (on the active path): its branch
    becomes the active one, with the rest of the conversation as it was there. Showing the
    version already shown changes nothing."""
    session = await lock_session(db, owner=owner, session_id=session_id)
    message = await _shown_message(db, session_id=session_id, message_id=message_id)
    branches = await branches_of(db, session_id=session_id)
    answered = await _answered_by(db, [message])
    point, shown = _version_of(branches, message, answered)
    siblings = [b for b in branches.values() if b.point == point]
    count = len(siblings) + 1
    if version == shown:
        return Switched(session_branch(session), count)
    if not 1 <= version <= count:
        raise NotFound(VERSION_NOT_FOUND)
    superseded = await _free(db, session)
    if version > 1:
        target = next(b.number for b in siblings if b.version == version)
    else:
        target = await _first_version_branch(db, session_id=session_id, point=point)
    signals = await _supersede_card(db, superseded)
    await _save(db, session_id=session_id, number=session_branch(session))
    await db.run(_CLEAR_STATE, {"session_id": session_id})
    await db.run(_RESTORE, {"session_id": session_id, "number": target})
    await _activate(db, session_id=session_id, branches=branches, leaf=target)
    return Switched(target, count, signals)


def session_branch(session: SessionRow) -> int:
    """The session's active branch, as its row was read under its lock."""
    return session.branch


async def versions(
    db: Db, *, session_id: str, messages: Sequence[MessageView]
) -> tuple[dict[str, Versions], list[Elsewhere]]:
    """The versions of each listed message that has more than one, and the actions done on
    other versions (none in a session that never branched: one read)."""
    branches = await branches_of(db, session_id=session_id)
    if not branches:
        return {}, []
    elsewhere = await effects_elsewhere(db, session_id=session_id)
    answered = await _answered_by(db, messages)
    counts: dict[str, int] = {}
    for branch in branches.values():
        if branch.point is not None:
            counts[branch.point] = counts.get(branch.point, 1) + 1
    found: dict[str, Versions] = {}
    for message in messages:
        point, shown = _version_of(branches, message, answered)
        if point in counts and _shows_versions(message, answered):
            found[message.id] = Versions(counts[point], shown)
    return found, elsewhere


def _shows_versions(message: MessageView, answered: dict[str, _Answered]) -> bool:
    """A user's message, or a turn's answer (not its tool steps)."""
    if message.role == "user":
        return True
    turn = answered.get(message.turn_id or "")
    return turn is not None and turn.assistant_message_id == message.id


@dataclass(frozen=True)
class _Answered:
    id: str
    user_message_id: str
    assistant_message_id: str | None


async def _answered_by(db: Db, messages: Iterable[MessageView | _Shown]) -> dict[str, _Answered]:
    """The turns of `messages`: which user message each answers, and with which answer."""
    ids = sorted({m.turn_id for m in messages if m.turn_id and m.role != "user"})
    if not ids:
        return {}
    rows = await db.rows(_ANSWERED, {"ids": ids}, _Answered)
    return {row.id: row for row in rows}


_ANSWERED = "SELECT id, user_message_id, assistant_message_id FROM turns WHERE id = ANY(%(ids)s)"


def _head_of(branches: dict[int, BranchRow], head: str | None) -> BranchRow | None:
    return next((b for b in branches.values() if head is not None and b.head == head), None)


def _version_of(
    branches: dict[int, BranchRow], message: Any, answered: dict[str, _Answered]
) -> tuple[str, int]:
    """Which versions the message is one of (its point), and which of them it is."""
    if message.role == "user":
        head = _head_of(branches, message.id)
        if head is not None and head.point is not None and head.point.startswith("msg:"):
            return head.point, head.version
        return edit_point(message.id), 1
    turn = answered.get(message.turn_id or "")
    if turn is None:
        return f"none:{message.id}", 1
    head = _head_of(branches, turn.id)
    if head is not None and head.point is not None and head.point.startswith("ans:"):
        return head.point, head.version
    return answer_point(turn.user_message_id), 1


async def _first_version_branch(db: Db, *, session_id: str, point: str) -> int:
    """The branch the first version of `point` was written on: the edited message's, or the
    answered message's (its first answer was born with it)."""
    message_id = point.split(":", 1)[1]
    found = await db.value(_BRANCH_OF, {"id": message_id, "session_id": session_id})
    if found is None:
        raise NotFound(VERSION_NOT_FOUND)
    return int(found)


_BRANCH_OF = "SELECT branch FROM messages WHERE id = %(id)s AND session_id = %(session_id)s"


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
    resting on its card may be left; the card is returned, to be superseded."""
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
    await _supersede(db, card)
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
    await _save(db, session_id=session.id, number=parent)
    row = BranchRow(number, parent, fork_seq, point, version, None)
    await db.run(_NEW_BRANCH, {"session_id": session.id, **vars(row)})
    await db.run(_KEEP_BEFORE, {"session_id": session.id, "seq": keep_before})
    await _activate(db, session_id=session.id, branches={**branches, number: row}, leaf=number)
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
# A new branch keeps the slots and pinned facts set before its fork.
_KEEP_BEFORE = """
    WITH slots_gone AS (
        DELETE FROM slots WHERE session_id = %(session_id)s AND set_at_seq >= %(seq)s
    )
    DELETE FROM pinned_facts WHERE session_id = %(session_id)s AND source_seq >= %(seq)s
"""


async def _save(db: Db, *, session_id: str, number: int) -> None:
    """The slots and pinned facts as the branch `number` leaves them."""
    await db.run(_SAVE, {"session_id": session_id, "number": number})


_SAVE = """
    UPDATE branches SET saved = jsonb_build_object(
        'slots', (SELECT coalesce(jsonb_agg(jsonb_build_array(name, value, source, set_at_seq)),
            '[]') FROM slots WHERE session_id = %(session_id)s),
        'facts', (SELECT coalesce(jsonb_agg(jsonb_build_array(key, value, source_seq, source,
            memory_key)), '[]') FROM pinned_facts WHERE session_id = %(session_id)s))
    WHERE session_id = %(session_id)s AND number = %(number)s
"""
_CLEAR_STATE = """
    WITH slots_gone AS (DELETE FROM slots WHERE session_id = %(session_id)s)
    DELETE FROM pinned_facts WHERE session_id = %(session_id)s
"""
# The branch's saved slots and facts, once the session's are cleared (`_CLEAR_STATE`), less
# what was forgotten since (its message is gone) or withdrawn (a fact copied from a durable
# memory item that is no longer there).
_RESTORE = """
    WITH saved AS (
        SELECT saved FROM branches WHERE session_id = %(session_id)s AND number = %(number)s
    ), slots_back AS (
        INSERT INTO slots (session_id, name, value, source, set_at_seq)
        SELECT %(session_id)s, s->>0, s->1, s->>2, CAST(s->>3 AS integer)
        FROM saved, jsonb_array_elements(coalesce(saved->'slots', '[]')) AS s
        WHERE EXISTS (SELECT 1 FROM messages
            WHERE session_id = %(session_id)s AND seq = CAST(s->>3 AS integer))
    )
    INSERT INTO pinned_facts (session_id, key, value, source_seq, source, memory_key)
    SELECT %(session_id)s, f->>0, f->>1, CAST(f->>2 AS integer), f->>3, f->>4
    FROM saved, jsonb_array_elements(coalesce(saved->'facts', '[]')) AS f
    WHERE EXISTS (SELECT 1 FROM messages
            WHERE session_id = %(session_id)s AND seq = CAST(f->>2 AS integer))
        AND (f->>4 IS NULL OR EXISTS (
            SELECT 1 FROM user_memory AS um JOIN sessions AS s
                ON um.tenant_id = s.tenant_id AND um.user_id = s.user_id
            WHERE s.id = %(session_id)s AND um.key = f->>4))
"""


async def _activate(db: Db, *, session_id: str, branches: dict[int, BranchRow], leaf: int) -> None:
    """Make `leaf` the session's active branch: mark what its path leaves out."""
    path = path_of(branches, leaf)
    params = {
        "session_id": session_id,
        "leaf": leaf,
        "branches": [b for b, _ in path],
        "limits": [limit for _, limit in path],
    }
    await db.run(_ACTIVATE, params)
    summaries = await db.rows(_SUMMARIES, {"session_id": session_id}, _Summary)
    if summaries:
        hidden = _summaries_off(branches, path, summaries, await _seqs(db, session_id))
        await db.run(_SUMMARIES_OFF, {"session_id": session_id, "hidden": hidden})


# On the path: a (branch, seq) the path's pairs hold. A result set follows its turn's.
_ON_PATH = """EXISTS (SELECT 1 FROM unnest(CAST(%(branches)s AS int[]),
        CAST(%(limits)s AS int[])) AS p(b, lim) WHERE p.b = {branch} AND {seq} < p.lim)"""
_ACTIVATE = f"""
    WITH session AS (
        UPDATE sessions SET branch = %(leaf)s WHERE id = %(session_id)s
    ), message_marks AS (
        UPDATE messages AS m SET off_path = NOT {_ON_PATH.format(branch="m.branch", seq="m.seq")}
        WHERE m.session_id = %(session_id)s
    )
    UPDATE result_sets AS r
    SET off_path = NOT {_ON_PATH.format(branch="t.branch", seq="t.user_seq")}
    FROM turns AS t
    WHERE r.session_id = %(session_id)s AND t.id = r.turn_id
"""


@dataclass(frozen=True)
class _Summary:
    id: int
    branch: int
    through_seq: int


_SUMMARIES = """
    SELECT id, branch, through_seq FROM conversation_summaries WHERE session_id = %(session_id)s
"""


@dataclass(frozen=True)
class _Seq:
    seq: int
    branch: int


async def _seqs(db: Db, session_id: str) -> list[_Seq]:
    return await db.rows(_SEQS, {"session_id": session_id}, _Seq)


_SEQS = "SELECT seq, branch FROM messages WHERE session_id = %(session_id)s ORDER BY seq"
_SUMMARIES_OFF = """
    UPDATE conversation_summaries SET off_path = (id = ANY(%(hidden)s))
    WHERE session_id = %(session_id)s
"""


def _summaries_off(
    branches: dict[int, BranchRow],
    path: Sequence[tuple[int, int]],
    summaries: Iterable[_Summary],
    seqs: Sequence[_Seq],
) -> list[int]:
    """The summary versions the path cannot read: written on a branch whose path differs
    from this one at or before the version's end."""
    hidden = []
    for summary in summaries:
        theirs = path_of(branches, summary.branch)
        for message in seqs:
            if message.seq > summary.through_seq:
                break
            mine = on_path(path, message.branch, message.seq)
            if mine != on_path(theirs, message.branch, message.seq):
                hidden.append(summary.id)
                break
    return hidden


@dataclass(frozen=True)
class Elsewhere:
    """An action executed on a turn off the active path: it happened, whatever version of the
    conversation is shown."""

    action_id: str
    tool: str
    summary: str
    recipient_masked: str | None
    status: str
    resolved_at: datetime | None


# The session `{session}`'s actions executed on turns off its active path (their turn's
# own messages are off it), newest last, as JSON arrays in `Elsewhere`'s order. Here, and
# among a context build's rows (store/context.py).
ELSEWHERE_OF_SESSION = f"""(SELECT coalesce(json_agg(json_build_array(a.id, a.tool, a.summary,
        a.recipient_masked, a.status, a.resolved_at) ORDER BY a.resolved_at), '[]')
    FROM actions AS a
    WHERE a.session_id = {{session}} AND a.status = '{ActionStatus.executed.value}'
        AND EXISTS (SELECT 1 FROM messages AS am WHERE am.turn_id = a.turn_id
            AND am.role <> 'user' AND am.off_path))"""


async def effects_elsewhere(db: Db, *, session_id: str) -> list[Elsewhere]:
    found = await db.value(
        "SELECT " + ELSEWHERE_OF_SESSION.format(session="%(session_id)s"),
        {"session_id": session_id},
    )
    return parse_elsewhere(found)


def parse_elsewhere(found: list[list[Any]] | None) -> list[Elsewhere]:
    return [
        Elsewhere(str(a), str(t), str(s), r, str(st), _when(at))
        for a, t, s, r, st, at in found or []
    ]


def _when(value: Any) -> datetime | None:
    if value is None or isinstance(value, datetime):
        return value
    return datetime.fromisoformat(str(value))
