"""Counting what a worker sends to PostgreSQL (tests/system/test_worker_cost.py,
test_card_cost.py; the `counted` fixture of tests/system/conftest.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

from parley.store.db import Database
from parley.store.events import APPENDS_ALONE
from parley.store.outbox import START_STATEMENTS

# Statements whose number depends on how an answer's tokens fall into frames and spans into
# batches, not on the turn's shape: the event log's appends alone (a statement that appends
# beside other work, the context build's read with its move, counts) and the trace spans'
# writes.
APPENDS = {statement.strip() for statement in APPENDS_ALONE}
VARIABLE_STATEMENTS = ("INSERT INTO turn_events", "INSERT INTO trace_spans")
# The turn's start, which the worker that claims a posted turn sends before its steps (the
# API sent its start mark before workers started turns): counted apart (`starts`).
STARTS = {statement.strip() for statement in START_STATEMENTS}


@dataclass
class Counted:
    """A worker's own engine (`sessions`), every statement it sent, and every `BEGIN`,
    `COMMIT` and `ROLLBACK` psycopg sent around them (`transactions`)."""

    sessions: Database
    sent: list[str] = field(default_factory=list)
    transactions: list[str] = field(default_factory=list)

    def counted(self) -> list[str]:
        """What was sent for the turn's steps, less the statements whose number is not the
        turn's shape and the turn's start (`starts`)."""
        return [
            s.split("\n")[0][:100]
            for s in self.sent
            if s not in APPENDS and s not in STARTS and not s.startswith(VARIABLE_STATEMENTS)
        ]

    def starts(self) -> list[str]:
        """What was sent to start the turns: a claim and a start mark each."""
        return [s.split("\n")[0][:100] for s in self.sent if s in STARTS]


# Settings for a stack whose statements per turn are counted: the turn's own, without recall
# by meaning's background embedding, which the session's summary run does after the turn (its
# statements would land in the count or not by when that run gets to them; the embedding's
# own cost is tests/system/test_context_cost.py's and the bench's).
TURN_ALONE = {"embeddings": ""}
