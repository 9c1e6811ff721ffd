"""Durable, consented memory in PostgreSQL: a user's consent, their remembered items, and the
copies derived from them (parley/consented.py has the rules).

Every read of items filters on `expires_at > now()` in the query, so an expired item is never
read, whether or not anything has swept it yet. Writes take the consent row's lock first, so
an item cannot be written after a concurrent "consent off" committed its deletion.

Like every store module these never commit; the caller does.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta

from sqlalchemy import Text, cast, delete, func, select
from sqlalchemy.dialects.postgresql import ARRAY, insert
from sqlalchemy.ext.asyncio import AsyncSession

from parley.consented import MemoryItem, Remembered
from parley.memory import PinnedFact
from parley.store.models import (
    ChatSession,
    ConversationSummary,
    MemoryConsent,
    ModelCall,
    PinnedFactRow,
    Turn,
    UserMemoryItem,
)

# The key a model request stores the hinted memory keys under (read back by the summarizer).
HINTED_KEYS = "memory_hints"


async def has_consent(db: AsyncSession, *, tenant_id: str, user_id: str) -> bool:
    consent = await db.scalar(
        select(MemoryConsent.consent).where(
            MemoryConsent.tenant_id == tenant_id, MemoryConsent.user_id == user_id
        )
    )
    return bool(consent)


async def set_consent(db: AsyncSession, *, tenant_id: str, user_id: str, consent: bool) -> None:
    """Record the user's choice; withdrawing it deletes every item and every derived copy."""
    values = {"consent": consent, "updated_at": func.now()}
    await db.execute(
        insert(MemoryConsent)
        .values(tenant_id=tenant_id, user_id=user_id, **values)
        .on_conflict_do_update(index_elements=["tenant_id", "user_id"], set_=values)
    )
    if not consent:
        await forget(db, tenant_id=tenant_id, user_id=user_id, keys=None)


async def items(db: AsyncSession, *, tenant_id: str, user_id: str) -> list[MemoryItem]:
    """The user's live items (never an expired one), by key."""
    rows = await db.scalars(
        select(UserMemoryItem)
        .where(
            UserMemoryItem.tenant_id == tenant_id,
            UserMemoryItem.user_id == user_id,
            UserMemoryItem.expires_at > func.now(),
        )
        .order_by(UserMemoryItem.key)
    )
    return [MemoryItem(r.key, r.value, r.source, r.created_at, r.expires_at) for r in rows]


async def remember(
    db: AsyncSession,
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
    consent = await db.scalar(
        select(MemoryConsent.consent)
        .where(MemoryConsent.tenant_id == tenant_id, MemoryConsent.user_id == user_id)
        .with_for_update()
    )
    if not consent:
        return []
    for item in wanted:
        values = {
            "value": item.value,
            "source": item.source,
            "created_at": func.now(),
            "expires_at": func.now() + timedelta(days=ttl_days),
        }
        await db.execute(
            insert(UserMemoryItem)
            .values(tenant_id=tenant_id, user_id=user_id, key=item.key, **values)
            .on_conflict_do_update(index_elements=["tenant_id", "user_id", "key"], set_=values)
        )
    return [item.key for item in wanted]


async def pin_copy(db: AsyncSession, *, session_id: str, key: str, value: str, seq: int) -> None:
    """The session's own copy of an item written from a statement made in it (a pinned fact
    with the item's key as provenance)."""
    fact = PinnedFact(key, value, seq)
    values = {
        "value": fact.value,
        "source_seq": fact.seq,
        "source": fact.source,
        "memory_key": key,
        "updated_at": func.now(),
    }
    await db.execute(
        insert(PinnedFactRow)
        .values(session_id=session_id, key=key, **values)
        .on_conflict_do_update(index_elements=["session_id", "key"], set_=values)
    )


async def forget(db: AsyncSession, *, tenant_id: str, user_id: str, keys: list[str] | None) -> int:
    """Delete the user's items (all of them when `keys` is None) and every copy derived from
    them: pinned facts written with them and summaries that folded turns shown their hints
    (the summary workflow rebuilds those from the messages). Returns the items deleted,
    expired ones included."""
    query = delete(UserMemoryItem).where(
        UserMemoryItem.tenant_id == tenant_id, UserMemoryItem.user_id == user_id
    )
    if keys is not None:
        query = query.where(UserMemoryItem.key.in_(keys))
    deleted = (await db.execute(query)).rowcount  # type: ignore[attr-defined]
    owned = select(ChatSession.id).where(
        ChatSession.tenant_id == tenant_id, ChatSession.user_id == user_id
    )
    facts = delete(PinnedFactRow).where(
        PinnedFactRow.session_id.in_(owned), PinnedFactRow.memory_key.is_not(None)
    )
    summaries = delete(ConversationSummary).where(
        ConversationSummary.session_id.in_(owned),
        func.jsonb_array_length(ConversationSummary.memory_keys) > 0,
    )
    if keys is not None:
        facts = facts.where(PinnedFactRow.memory_key.in_(keys))
        summaries = summaries.where(
            ConversationSummary.memory_keys.has_any(cast(keys, ARRAY(Text)))
        )
    await db.execute(facts)
    await db.execute(summaries)
    return int(deleted or 0)


async def hinted_keys(db: AsyncSession, *, session_id: str, through_seq: int) -> list[str]:
    """Memory keys whose hints were in the prompts of the session's turns up to `through_seq`:
    the provenance a summary folding those turns carries (its lines carry forward, so every
    turn it covers counts)."""
    shown = ModelCall.request["budget"][HINTED_KEYS]
    requests = await db.scalars(
        select(shown)
        .join(Turn, Turn.id == ModelCall.turn_id)
        .where(Turn.session_id == session_id, Turn.user_seq <= through_seq, shown.is_not(None))
    )
    keys: set[str] = set()
    for value in requests:
        keys.update(str(k) for k in value or [])
    return sorted(keys)


async def pinned_keys(db: AsyncSession, *, session_id: str) -> set[str]:
    """The memory keys of the session's pinned copies of durable items."""
    found = await db.scalars(
        select(PinnedFactRow.memory_key).where(
            PinnedFactRow.session_id == session_id, PinnedFactRow.memory_key.is_not(None)
        )
    )
    return {key for key in found if key is not None}
