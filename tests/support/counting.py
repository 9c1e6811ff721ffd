"""Counting what a worker sends to PostgreSQL (tests/system/test_worker_cost.py,
test_card_cost.py; the `counted` fixture of tests/system/conftest.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

from parley.store.db import Database

# Statements whose number depends on how an answer's tokens fall into frames and spans into
# batches, not on the turn's shape: the streamed deltas' appends and the trace spans' writes.
VARIABLE_STATEMENTS = ("INSERT INTO turn_events", "WITH counter", "INSERT INTO trace_spans")


@dataclass
class Counted:
    """A worker's own engine (`sessions`) and the first line of every statement it sent."""

    sessions: Database
    sent: list[str] = field(default_factory=list)

    def counted(self) -> list[str]:
        """What was sent, less the statements whose number is not the turn's shape."""
        return [s for s in self.sent if not s.startswith(VARIABLE_STATEMENTS)]


# Settings for a stack whose statements per turn are counted: the turn's own, without recall
# by meaning's background embedding, which the session's summary run does after the turn (its
# statements would land in the count or not by when that run gets to them; the embedding's
# own cost is tests/system/test_context_cost.py's and the bench's).
TURN_ALONE = {"embeddings": ""}
