"""Context building's hook for attached files: the files of the message being answered, as
prompt blocks (parley/attachments.py decides the shares, the chunks and the fence)."""

from __future__ import annotations

from parley.attachments import file_blocks
from parley.config import Settings
from parley.context import Block
from parley.store import files
from parley.store.db import Db
from parley.store.turns.reads import TurnFacts
from parley.tokens import TokenCounter


async def attached_file_blocks(
    db: Db, turn: TurnFacts, counter: TokenCounter, settings: Settings, terms: list[str]
) -> list[Block]:
    attached = await files.message_files(db, message_id=turn.user_message_id)
    if not attached:
        return []
    return file_blocks(counter, attached, budget_chars=settings.context_file_chars, terms=terms)
