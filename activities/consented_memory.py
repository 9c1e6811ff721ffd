"""Durable memory's two hooks in context building (parley/consented.py has the rules).

- `remember_validated`: before a step's prompt is packed, what this turn's validated events
  say to remember is stored, with consent only: a preference the user's message states (at
  step 0; the session gets a pinned copy with the item's key as provenance), and a confirmed
  choice of contact channel (an email proposal of this turn that the user confirmed). Both
  are upserts, so a retried step writes nothing twice.
- `hints`: the user's live items as the hints block, and the keys shown, which the stored
  request records so a summary of this turn knows it folded memory in.
"""

from __future__ import annotations

from dataclasses import dataclass

from parley.config import Settings
from parley.consented import confirmed_choice, hint_blocks, stated_preferences
from parley.context import Block, Packed
from parley.statuses import ActionStatus
from parley.store import actions, user_memory
from parley.store.db import Db
from parley.store.sessions import StoredMessage
from parley.store.turns.reads import TurnFacts
from parley.tokens import TokenCounter

# The user said yes to these (sent or not): a confirmed choice.
_CONFIRMED = (
    ActionStatus.confirmed,
    ActionStatus.executed,
    ActionStatus.unknown,
    ActionStatus.failed,
)


async def remember_validated(
    db: Db, turn: TurnFacts, settings: Settings, *, step: int, message: StoredMessage | None
) -> bool:
    """Store what this step's validated events say to remember (see above); whether the
    session got a pinned copy (the build then reads its pinned facts again). `message`: the
    turn's, as the build read it."""
    owner = {"tenant_id": turn.tenant_id, "user_id": turn.user_id}
    ttl = settings.memory_ttl_days
    if step == 0:
        stated = stated_preferences(message.text, message_id=message.id) if message else []
        written = await user_memory.remember(db, **owner, remembered=stated, ttl_days=ttl)
        for item in stated:
            if item.key in written:
                await user_memory.pin_copy(
                    db,
                    session_id=turn.session_id,
                    key=item.key,
                    value=item.value,
                    seq=turn.user_seq,
                )
        # A turn's actions are proposed by its tools, which run after this step's model
        # call: at step 0 it has none to read.
        return any(item.key in written for item in stated)
    confirmed = await actions.actions_in(db, turn_id=turn.id, statuses=_CONFIRMED)
    for action in confirmed:
        choice = confirmed_choice(tool=action.tool, action_id=action.id)
        await user_memory.remember(db, **owner, remembered=choice, ttl_days=ttl)
    return False


@dataclass(frozen=True)
class Hints:
    blocks: list[Block]
    keys: list[str]

    def shown(self, packed: Packed) -> list[str]:
        """The keys the prompt actually showed (none when the packer dropped the block)."""
        return self.keys if any(b in packed.kept for b in self.blocks) else []


async def hints(
    db: Db, turn: TurnFacts, counter: TokenCounter, *, consent: bool | None = None
) -> Hints:
    """The user's live items as the hints block (nothing without consent); `consent`: the
    user's choice when the caller read it already."""
    owner = {"tenant_id": turn.tenant_id, "user_id": turn.user_id}
    if consent is None:
        consent = await user_memory.has_consent(db, **owner)
    if not consent:
        return Hints([], [])
    # An item stated in this session is already pinned here, as what the user said; shown
    # again as "last time" it would only repeat it, wrongly dated.
    here = await user_memory.pinned_keys(db, session_id=turn.session_id)
    items = [i for i in await user_memory.items(db, **owner) if i.key not in here]
    return Hints(hint_blocks(counter, items), [item.key for item in items])
