"""Counting what a worker sends to PostgreSQL (tests/system/test_worker_cost.py,
test_card_cost.py; the `counted` fixture of tests/system/conftest.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

from parley.store.db import Database
from parley.store.events import APPENDS_ALONE

# Statements whose number depends on how an answer's tokens fall into frames and spans into
# batches, not on the turn's shape: the event log's appends alone (a statement that appends
# beside other work, the context build's read with its move, counts) and the trace spans'
# writes.
APPENDS = {statement.strip() for statement in APPENDS_ALONE}
VARIABLE_STATEMENTS = ("INSERT INTO turn_events", "INSERT INTO trace_spans")


@dataclass
class Counted:
    """A worker's own engine (`sessions`) and every statement it sent."""

    sessions: Database
    sent: list[str] = field(default_factory=list)

    def counted(self) -> list[str]:
        """What was sent, less the statements whose number is not the turn's shape."""
        return [
            s.split("\n")[0][:100]
            for s in self.sent
            if s not in APPENDS and not s.startswith(VARIABLE_STATEMENTS)
        ]


# Settings for a stack whose statements per turn are counted: the turn's own, without recall
# by meaning's background embedding, which the session's summary run does after the turn (its
# statements would land in the count or not by when that run gets to them; the embedding's
# own cost is tests/system/test_context_cost.py's and the bench's).
TURN_ALONE = {"embeddings": ""}
