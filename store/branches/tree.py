"""A session's branches as rows and paths, read: which versions a message has, which of
them is shown, and what happened on the versions not shown (the model: store/branches/__init__.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from parley.statuses import ActionStatus
from parley.store.db import Db
from parley.wire import MessageView

# Above every seq (seqs are 32-bit in the store): the limit of a branch's own messages.
ALL = 2**31 - 1


@dataclass(frozen=True)
class BranchRow:
    number: int
    parent: int | None
    fork_seq: int | None
    point: str | None
    version: int
    head: str | None
    # When it was last the active branch, and the seq of its first own message (None: none).
    shown_at: datetime | None = None
    first_seq: int | None = None


def path_of(branches: dict[int, BranchRow], leaf: int) -> list[tuple[int, int]]:
    """The path of branch `leaf` as (branch, below seq) pairs: a message of branch `b` at
    seq `s` is on it when a pair (b, limit) has s < limit."""
    path, limit, number = [], ALL, leaf
    while True:
        path.append((number, limit))
        row = branches.get(number)
        if row is None or row.parent is None or row.fork_seq is None:
            return path
        limit, number = min(limit, row.fork_seq), row.parent


def last_shown(branches: dict[int, BranchRow], version_of: int, from_seq: int) -> int:
    """The branch that shows a version best: of `version_of` (the branch it is shown on) and
    the branches forked from it that keep it (every fork between them after `from_seq`, the
    version's first seq), the one shown last."""

    def keeps(number: int) -> bool:
        while number != version_of:
            row = branches.get(number)
            if row is None or row.parent is None or (row.fork_seq or 0) <= from_seq:
                return False
            number = row.parent
        return True

    kept = [b for b in branches.values() if keeps(b.number)]
    if not kept:
        return version_of
    return max(kept, key=lambda b: (b.shown_at is not None, b.shown_at or 0, b.number)).number


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


async def branches_of(db: Db, *, session_id: str) -> dict[int, BranchRow]:
    rows = await db.rows(_BRANCHES, {"session_id": session_id}, BranchRow)
    return {row.number: row for row in rows}


_BRANCHES = """
    SELECT b.number, b.parent, b.fork_seq, b.point, b.version, b.head, b.shown_at,
        (SELECT min(m.seq) FROM messages AS m
            WHERE m.session_id = b.session_id AND m.branch = b.number) AS first_seq
    FROM branches AS b
    WHERE b.session_id = %(session_id)s
"""


class Listed(Protocol):
    """A message as the versions are read for it (`MessageView`, or a row of its columns)."""

    @property
    def id(self) -> str: ...
    @property
    def role(self) -> str: ...
    @property
    def turn_id(self) -> str | None: ...


async def versions(
    db: Db, *, session_id: str, messages: Sequence[MessageView]
) -> tuple[dict[str, Versions], list[Elsewhere]]:
    """The versions of each listed message that has more than one, and the actions done on
    other versions (none in a session that never branched: one read)."""
    branches = await branches_of(db, session_id=session_id)
    if not branches:
        return {}, []
    elsewhere = await effects_elsewhere(db, session_id=session_id)
    answered = await answered_by(db, messages)
    counts: dict[str, int] = {}
    for branch in branches.values():
        if branch.point is not None:
            counts[branch.point] = counts.get(branch.point, 1) + 1
    found: dict[str, Versions] = {}
    for message in messages:
        point, shown = version_of(branches, message, answered)
        if point in counts and shows_versions(message, answered):
            found[message.id] = Versions(counts[point], shown)
    return found, elsewhere


def shows_versions(message: MessageView, answered: dict[str, Answered]) -> bool:
    """A user's message, or a turn's answer (not its tool steps)."""
    if message.role == "user":
        return True
    turn = answered.get(message.turn_id or "")
    return turn is not None and turn.assistant_message_id == message.id


@dataclass(frozen=True)
class Answered:
    id: str
    user_message_id: str
    assistant_message_id: str | None


async def answered_by(db: Db, messages: Iterable[Listed]) -> dict[str, Answered]:
    """The turns of `messages`: which user message each answers, and with which answer."""
    ids = sorted({m.turn_id for m in messages if m.turn_id and m.role != "user"})
    if not ids:
        return {}
    rows = await db.rows(_ANSWERED, {"ids": ids}, Answered)
    return {row.id: row for row in rows}


_ANSWERED = "SELECT id, user_message_id, assistant_message_id FROM turns WHERE id = ANY(%(ids)s)"


def head_of(branches: dict[int, BranchRow], head: str | None) -> BranchRow | None:
    return next((b for b in branches.values() if head is not None and b.head == head), None)


def version_of(
    branches: dict[int, BranchRow], message: Any, answered: dict[str, Answered]
) -> tuple[str, int]:
    """Which versions the message is one of (its point), and which of them it is."""
    if message.role == "user":
        head = head_of(branches, message.id)
        if head is not None and head.point is not None and head.point.startswith("msg:"):
            return head.point, head.version
        return edit_point(message.id), 1
    turn = answered.get(message.turn_id or "")
    if turn is None:
        return f"none:{message.id}", 1
    head = head_of(branches, turn.id)
    if head is not None and head.point is not None and head.point.startswith("ans:"):
        return head.point, head.version
    return answer_point(turn.user_message_id), 1


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
