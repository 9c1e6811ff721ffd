"""Prometheus metrics exposed at /metrics."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from parley.store.db import Engine, count_work

MESSAGES_POSTED = Counter(
    "parley_messages_posted_total", "User messages posted, by outcome", ["outcome"]
)
TURN_START_FAILURES = Counter(
    "parley_turn_start_failures_total",
    "Workflow starts the API could not make (the worker's outbox sweep starts them)",
)
STREAMS_OPEN = Gauge("parley_event_streams_open", "Event streams currently open")
EVENTS_SENT = Counter("parley_events_sent_total", "Events written to SSE clients")
# How long a hand-off waited for an agent's claim, and how long it was open until an agent
# resolved it or handed it back (`outcome`), measured from the case's opening.
_HANDOFF_BUCKETS = (15, 60, 300, 900, 1800, 3600, 4 * 3600, 24 * 3600)
HANDOFF_CLAIM_SECONDS = Histogram(
    "parley_handoff_claim_seconds",
    "Seconds from a hand-off's opening to an agent's claim",
    buckets=_HANDOFF_BUCKETS,
)
HANDOFF_OPEN_SECONDS = Histogram(
    "parley_handoff_open_seconds",
    "Seconds from a hand-off's opening to its end, by outcome (resolved, handed_back)",
    ["outcome"],
    buckets=_HANDOFF_BUCKETS,
)
DB_STATEMENTS = Counter(
    "parley_db_statements_total", "SQL statements this process sent to PostgreSQL"
)
DB_CHECKOUTS = Counter(
    "parley_db_checkouts_total", "Connections this process took from its pool (one per session)"
)


def count_database_work(engine: Engine) -> None:
    """Count the engine's statements and pool checkouts (the bench reports them per turn)."""
    count_work(engine, on_statement=DB_STATEMENTS.inc, on_checkout=DB_CHECKOUTS.inc)
