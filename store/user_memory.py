"""Durable, consented memory in PostgreSQL: a user's consent, their remembered items, and the
copies derived from them (parley/consented.py has the rules).

Every read of items filters on `expires_at > now()` in the query, so an expired item is never
read, whether or not anything has swept it yet. Writes take the consent row's lock first, so
an item cannot be written after a concurrent "consent off" committed its deletion.

Like every store module these never commit; the caller does.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import timedelta

from parley.consented import MemoryItem, Remembered
from parley.memory import PinnedFact
from parley.store.branches.path import facts_dropped
from parley.store.db import Db

# The key a model request stores the hinted memory keys under (read back by the summarizer).
HINTED_KEYS = "memory_hints"


async def has_consent(db: Db, *, tenant_id: str, user_id: str) -> bool:
    return bool(await db.value(_CONSENT, {"tenant_id": tenant_id, "user_id": user_id}))


_CONSENT = """
    SELECT consent FROM memory_consents WHERE tenant_id = %(tenant_id)s AND user_id = %(user_id)s
"""


async def set_consent(db: Db, *, tenant_id: str, user_id: str, consent: bool) -> None:
    """Record the user's choice; withdrawing it deletes every item and every derived copy."""
    params = {"tenant_id": tenant_id, "user_id": user_id, "consent": consent}
    await db.run(_SET_CONSENT, params)
    if not consent:
        await forget(db, tenant_id=tenant_id, user_id=user_id, keys=None)


_SET_CONSENT = """
    INSERT INTO memory_consents (tenant_id, user_id, consent, updated_at)
    VALUES (%(tenant_id)s, %(user_id)s, %(consent)s, now())
    ON CONFLICT (tenant_id, user_id)
    DO UPDATE SET consent = excluded.consent, updated_at = excluded.updated_at
"""


async def items(db: Db, *, tenant_id: str, user_id: str) -> list[MemoryItem]:
    """The user's live items (never an expired one), by key."""
    return await db.rows(_ITEMS, {"tenant_id": tenant_id, "user_id": user_id}, MemoryItem)


_ITEMS = """
    SELECT key, value, source, created_at, expires_at FROM user_memory
    WHERE tenant_id = %(tenant_id)s AND user_id = %(user_id)s AND expires_at > now()
    ORDER BY key
"""


async def remember(
    db: Db,
    *,
    tenant_id: str,
    user_id: str,
    remembered: Iterable[Remembered],
    ttl_days: int,
) -> list[str]:
    """Store what a validated event says to remember, only with consent; returns the keys
    written (none without consent). A later statement replaces an earlier one's value."""
    wanted = list(remembered)
    if not wanted:
        return []
    owner = {"tenant_id": tenant_id, "user_id": user_id}
    if not await db.value(_CONSENT_LOCKED, owner):
        return []
    for item in wanted:
        values = {"key": item.key, "value": item.value, "source": item.source}
        await db.run(_REMEMBER, owner | values | {"ttl": timedelta(days=ttl_days)})
    return [item.key for item in wanted]


_CONSENT_LOCKED = f"{_CONSENT} FOR UPDATE"
_REMEMBER = """
    INSERT INTO user_memory (tenant_id, user_id, key, value, source, created_at, expires_at)
    VALUES (%(tenant_id)s, %(user_id)s, %(key)s, %(value)s, %(source)s, now(),
        now() + %(ttl)s)
    ON CONFLICT (tenant_id, user_id, key) DO UPDATE SET value = excluded.value,
        source = excluded.source, created_at = excluded.created_at,
        expires_at = excluded.expires_at
"""


async def pin_copy(db: Db, *, session_id: str, key: str, value: str, seq: int) -> None:
    """The session's own copy of an item written from a statement made in it (a pinned fact
    with the item's key as provenance)."""
    fact = PinnedFact(key, value, seq)
    params = {"session_id": session_id, "key": key, "value": fact.value, "seq": fact.seq}
    await db.run(_PIN_COPY, params | {"source": fact.source})


_PIN_COPY = """
    INSERT INTO pinned_facts (session_id, key, value, source_seq, source, memory_key, updated_at)
    VALUES (%(session_id)s, %(key)s, %(value)s, %(seq)s, %(source)s, %(key)s, now())
    ON CONFLICT (session_id, key) DO UPDATE SET value = excluded.value,
        source_seq = excluded.source_seq, source = excluded.source,
        memory_key = excluded.memory_key, updated_at = excluded.updated_at
"""


async def forget(db: Db, *, tenant_id: str, user_id: str, keys: list[str] | None) -> int:
    """Delete the user's items (all of them when `keys` is None) and every copy derived from
    them: pinned facts written with them and summaries that folded turns shown their hints
    (the summary workflow rebuilds those from the messages). Returns the items deleted,
    expired ones included. One statement."""
    params = {"tenant_id": tenant_id, "user_id": user_id, "keys": keys}
    return int(await db.value(_FORGET, params) or 0)


# `keys` NULL: every key. The three deletes (and the facts saved with the session's other
# branches: store/branches/path.py) see the tables as the statement found them (they touch
# different tables, so none waits on another's effect).
_SAVED_FACTS_GONE = facts_dropped(
    "f->>4 IS NOT NULL AND (CAST(%(keys)s AS text[]) IS NULL OR f->>4 = ANY(%(keys)s))"
)
_FORGET = f"""
    WITH owned AS (
        SELECT id FROM sessions WHERE tenant_id = %(tenant_id)s AND user_id = %(user_id)s
    ), items AS (
        DELETE FROM user_memory
        WHERE tenant_id = %(tenant_id)s AND user_id = %(user_id)s
            AND (CAST(%(keys)s AS text[]) IS NULL OR key = ANY(%(keys)s))
        RETURNING 1
    ), facts AS (
        DELETE FROM pinned_facts
        WHERE session_id IN (SELECT id FROM owned) AND memory_key IS NOT NULL
            AND (CAST(%(keys)s AS text[]) IS NULL OR memory_key = ANY(%(keys)s))
    ), summaries AS (
        DELETE FROM conversation_summaries
        WHERE session_id IN (SELECT id FROM owned) AND jsonb_array_length(memory_keys) > 0
            AND (CAST(%(keys)s AS text[]) IS NULL OR memory_keys ?| CAST(%(keys)s AS text[]))
    ), saved AS (
        UPDATE branches SET {_SAVED_FACTS_GONE}
        WHERE session_id IN (SELECT id FROM owned) AND saved IS NOT NULL
    )
    SELECT count(*) FROM items
"""


@dataclass(frozen=True)
class _Hints:
    keys: list[str] | None


async def hinted_keys(db: Db, *, session_id: str, through_seq: int) -> list[str]:
    """Memory keys whose hints were in the prompts of the session's turns up to `through_seq`:
    the provenance a summary folding those turns carries (its lines carry forward, so every
    turn it covers counts)."""
    params = {"session_id": session_id, "through_seq": through_seq, "hinted": HINTED_KEYS}
    found: set[str] = set()
    for hints in await db.rows(_HINTED, params, _Hints):
        found.update(str(k) for k in hints.keys or [])
    return sorted(found)


_HINTED = """
    SELECT c.request -> 'budget' -> %(hinted)s AS keys
    FROM model_calls AS c JOIN turns AS t ON t.id = c.turn_id
    WHERE t.session_id = %(session_id)s AND t.user_seq <= %(through_seq)s
        AND c.request -> 'budget' -> %(hinted)s IS NOT NULL
"""


async def pinned_keys(db: Db, *, session_id: str) -> set[str]:
    """The memory keys of the session's pinned copies of durable items."""
    found = await db.value(_PINNED_KEYS, {"session_id": session_id})
    return set(found or ())


_PINNED_KEYS = """
    SELECT array_agg(memory_key) FROM pinned_facts
    WHERE session_id = %(session_id)s AND memory_key IS NOT NULL
"""
