"""Importing earlier conversation (issue 39): the rules an import's items keep, and what makes
two imports the same one. Pure; the store writes them (store/imports.py), the API admits them
(api/routes/imports.py), and a workflow indexes them (workflows/imports.py).

An import is history, not turns: its messages take the session's next seqs with their
original times, in the order given, and nothing runs for them but indexing. So every item is
checked before anything is stored, and a refusal names the first item that breaks a rule
(`index`, and `field` as `items.<index>.<name>`), so one bad line of two thousand is found.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from parley.errors import InvalidRequest

ROLES = ("user", "assistant")
# The earliest time an item may carry: earlier is a mistake, and years near 1 overflow when
# converted to UTC.
EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class ImportItem:
    """One earlier message: who said it, what, and when (timezone-aware)."""

    role: str
    text: str
    created_at: datetime


def check_items(items: Sequence[ImportItem], *, now: datetime, max_chars: int) -> None:
    """Refuse the first item that breaks a rule (InvalidRequest with its `index`): a role
    other than user or assistant, text empty or over `max_chars`, a time without a zone,
    later than `now` or before 1970, or before the item above it (an import reads as it was
    said, so seq order and time order agree)."""
    previous: datetime | None = None
    for index, item in enumerate(items):
        if item.role not in ROLES:
            _refuse(index, "role", f"must be one of {', '.join(ROLES)}")
        if not item.text.strip():
            _refuse(index, "text", "must not be empty")
        if len(item.text) > max_chars:
            _refuse(index, "text", f"at most {max_chars} characters")
        if "\x00" in item.text:
            _refuse(index, "text", "must not contain NUL characters")
        moment = item.created_at
        if moment.tzinfo is None or moment.utcoffset() is None:
            _refuse(index, "created_at", "must carry a timezone")
        if moment > now:
            _refuse(index, "created_at", "must not be later than now")
        if moment < EARLIEST:
            _refuse(index, "created_at", "must not be before 1970")
        if previous is not None and moment < previous:
            _refuse(index, "created_at", "must not be earlier than the item before it")
        previous = moment


def _refuse(index: int, name: str, why: str) -> None:
    field = f"items.{index}.{name}"
    raise InvalidRequest(f"{field}: {why}; nothing was imported", field=field, index=index)


def digest(items: Sequence[ImportItem]) -> str:
    """What an import holds, as one hash: the same client key with another digest is another
    import (refused), with the same one a repeat (answered with the first)."""
    canonical = [[i.role, i.text, i.created_at.astimezone(UTC).isoformat()] for i in items]
    encoded = json.dumps(canonical, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(encoded.encode()).hexdigest()
