"""What a context build tells the stream beside the prompt it stores: that something was left
out of the answer's context (`context_trimmed`), and that an import's messages are not all
searchable yet (`recall_pending`). Each once per turn; the stored request says the same."""

from __future__ import annotations

from parley.contracts import WarningCode
from parley.store.db import Db
from parley.store.events import warn_once
from parley.store.turns.reads import TurnFacts
from parley.wire import WarningData

# The warning a turn emits when the packer left something out.
CONTEXT_TRIMMED = WarningCode.context_trimmed


async def warn_pending(db: Db, turn: TurnFacts, *, pending: bool) -> None:
    """An import still being indexed (`pending`, and recall ran) is said, not silently
    missing: recall by meaning does not find its messages yet (full-text search does)."""
    if pending:
        await _warn_once(
            db,
            turn,
            WarningCode.recall_pending,
            "Earlier messages imported into this conversation are still being indexed; this "
            "answer may not find all of them yet.",
        )


async def warn_dropped(db: Db, turn: TurnFacts, missing: list[str]) -> None:
    """A drop is never silent: the stream says what the answer could not take into account
    (the prompt itself carries the packer's note). Nothing `missing`: no word."""
    if missing:
        await _warn_once(
            db,
            turn,
            CONTEXT_TRIMMED,
            "Not everything fit in this answer's context; left out: " + "; ".join(missing) + ".",
        )


async def _warn_once(db: Db, turn: TurnFacts, code: WarningCode, message: str) -> None:
    """The `warning` event, once per turn and code (a retried build says it no twice)."""
    await warn_once(db, turn_id=turn.id, data=WarningData(code=code, message=message))
