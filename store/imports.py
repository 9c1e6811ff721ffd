"""Imported conversation (parley/imports.py) in the store: its messages written as history in
one statement, the import's row (its client key, its indexing's progress), and the reads the
status route, the import workflow and the context build make of it.

`import_messages` is the API's write, in the caller's transaction: lock the session row
(as every writer that takes seqs does), answer a repeat of the same key with its import, refuse
while a turn is active or queued, take the seqs (store/messages.py `take_seqs`, where the seq rule
moves `sessions.last_seq`), then one multi-row INSERT of the messages and one of the import.
The messages carry their original times as `created_at`, no turn, and their token counts as
every message write stores them; full-text search indexes them as they are written (the
`tsv` column is generated), recall by meaning once the import workflow has embedded them.

Like every store module nothing here commits; the caller does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from parley.contracts import MessageStatus
from parley.errors import IdempotencyKeyReused, NotFound, TurnInProgress
from parley.ids import new_id
from parley.imports import ImportItem
from parley.statuses import ImportState
from parley.store.db import Db
from parley.store.identity import Identity
from parley.store.messages import take_seqs, token_count
from parley.store.sessions import lock_session

IMPORT_NOT_FOUND = "import not found"


@dataclass(frozen=True)
class ImportRow:
    id: str
    session_id: str
    client_import_id: str
    digest: str
    messages: int
    first_seq: int
    last_seq: int
    status: str  # an ImportState
    indexed: int
    created_at: datetime
    finished_at: datetime | None


@dataclass(frozen=True)
class Imported:
    row: ImportRow
    created: bool  # False: a repeat of an earlier import, answered with it


async def import_messages(
    db: Db,
    *,
    owner: Identity,
    session_id: str,
    client_import_id: str,
    digest: str,
    items: Sequence[ImportItem],
) -> Imported:
    """Store the items as the session's next messages and the import's row (items checked
    already: parley/imports.py `check_items`). NotFound for another user's session; the same
    key with other items is IdempotencyKeyReused; a turn active or queued, TurnInProgress."""
    session = await lock_session(db, owner=owner, session_id=session_id)
    params = {"session_id": session_id, "key": client_import_id}
    earlier = await db.row(_BY_KEY, params, ImportRow)
    if earlier is not None:
        if earlier.digest != digest:
            raise IdempotencyKeyReused("this client_import_id was already used with other items")
        return Imported(earlier, created=False)
    busy = session.active_turn_id or session.queued_turn_id
    if busy is not None:
        raise TurnInProgress(
            "a turn is running in this session; import once it has ended", active_turn_id=busy
        )
    first = await take_seqs(db, session_id=session_id, count=len(items))
    await db.run(_INSERT_MESSAGES, _message_params(session_id, first, items))
    row = await db.row(
        _INSERT_IMPORT,
        params
        | {
            "id": new_id("imp"),
            "tenant_id": owner.tenant_id,
            "user_id": owner.user_id,
            "digest": digest,
            "messages": len(items),
            "first_seq": first,
            "last_seq": first + len(items) - 1,
            "status": ImportState.pending.value,
        },
        ImportRow,
    )
    assert row is not None  # INSERT … RETURNING
    return Imported(row, created=True)


_COLUMNS = """id, session_id, client_import_id, digest, messages, first_seq, last_seq, status,
    indexed, created_at, finished_at"""

_BY_KEY = f"""
    SELECT {_COLUMNS} FROM imports
    WHERE session_id = %(session_id)s AND client_import_id = %(key)s
"""

_INSERT_IMPORT = f"""
    INSERT INTO imports (id, session_id, tenant_id, user_id, client_import_id, digest, messages,
        first_seq, last_seq, status)
    VALUES (%(id)s, %(session_id)s, %(tenant_id)s, %(user_id)s, %(key)s, %(digest)s,
        %(messages)s, %(first_seq)s, %(last_seq)s, %(status)s)
    RETURNING {_COLUMNS}
"""


def _message_params(session_id: str, first: int, items: Sequence[ImportItem]) -> dict[str, object]:
    """The items as one array per column (one INSERT over their `unnest`), each counted as
    every stored message is (store/messages.py `token_count`)."""
    counted = [token_count(item.role, item.text) for item in items]
    return {
        "session_id": session_id,
        "ids": [new_id("msg") for _ in items],
        "seqs": list(range(first, first + len(items))),
        "roles": [item.role for item in items],
        "texts": [item.text for item in items],
        "tokens": [c["token_count"] for c in counted],
        "counters": [c["token_counter"] for c in counted],
        "times": [item.created_at for item in items],
    }


_INSERT_MESSAGES = f"""
    INSERT INTO messages (id, session_id, seq, role, status, text, token_count, token_counter,
        created_at, branch)
    SELECT id, %(session_id)s, seq, role, '{MessageStatus.complete.value}', text, tokens,
        counter, created_at,
        (SELECT branch FROM sessions WHERE id = CAST(%(session_id)s AS varchar))
    FROM unnest(CAST(%(ids)s AS text[]), CAST(%(seqs)s AS int[]), CAST(%(roles)s AS text[]),
        CAST(%(texts)s AS text[]), CAST(%(tokens)s AS int[]), CAST(%(counters)s AS text[]),
        CAST(%(times)s AS timestamptz[]))
        AS item(id, seq, role, text, tokens, counter, created_at)
"""


async def get_import(db: Db, *, owner: Identity, session_id: str, import_id: str) -> ImportRow:
    """The owner's import in their session; NotFound for anyone else's (or a deleted
    session's)."""
    params = {
        "id": import_id,
        "session_id": session_id,
        "tenant_id": owner.tenant_id,
        "user_id": owner.user_id,
    }
    row = await db.row(_OWNED, params, ImportRow)
    if row is None:
        raise NotFound(IMPORT_NOT_FOUND)
    return row


_OWNED = """
    SELECT i.id, i.session_id, i.client_import_id, i.digest, i.messages, i.first_seq,
        i.last_seq, i.status, i.indexed, i.created_at, i.finished_at
    FROM imports i JOIN sessions s ON s.id = i.session_id
    WHERE i.id = %(id)s AND i.session_id = %(session_id)s AND s.tenant_id = %(tenant_id)s
        AND s.user_id = %(user_id)s AND s.deleted_at IS NULL
"""


async def import_of(conn: Db, *, import_id: str) -> ImportRow | None:
    """The import as its workflow reads it (None: erased with its session meanwhile)."""
    return await conn.row(_BY_ID, {"id": import_id}, ImportRow)


_BY_ID = f"SELECT {_COLUMNS} FROM imports WHERE id = %(id)s"


async def record_progress(conn: Db, *, import_id: str, indexed: int, done: bool) -> None:
    """How many of the import's messages have a vector; `done` ends it (a done import stays
    done: a retried step never moves it back)."""
    status = ImportState.done if done else ImportState.indexing
    params = {"id": import_id, "indexed": indexed, "status": status.value, "done": done}
    await conn.run(_PROGRESS, params)


_PROGRESS = f"""
    UPDATE imports SET indexed = %(indexed)s, status = %(status)s,
        finished_at = CASE WHEN %(done)s THEN now() END
    WHERE id = %(id)s AND status <> '{ImportState.done.value}'
"""


async def unembedded_count(conn: Db, *, row: ImportRow, model: str) -> int:
    """How many of the import's messages have no vector of `model` yet (the caller knows the
    vectors' table is there: store/embeddings.py `available`)."""
    params = {"session_id": row.session_id, "first": row.first_seq, "last": row.last_seq}
    return int(await conn.value(_UNEMBEDDED, params | {"model": model}))


_UNEMBEDDED = """
    SELECT count(*) FROM messages m
    WHERE m.session_id = %(session_id)s AND m.seq BETWEEN %(first)s AND %(last)s
        AND NOT EXISTS (SELECT 1 FROM message_embeddings e
            WHERE e.message_id = m.id AND e.model = %(model)s)
"""
