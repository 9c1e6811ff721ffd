"""Prometheus metrics exposed at /metrics."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

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
DB_STATEMENTS = Counter(
    "parley_db_statements_total", "SQL statements this process sent to PostgreSQL"
)
DB_CHECKOUTS = Counter(
    "parley_db_checkouts_total", "Connections this process took from its pool (one per session)"
)


def count_database_work(engine: Engine) -> None:
    """Count the engine's statements and pool checkouts (the bench reports them per turn)."""
    count_work(engine, on_statement=DB_STATEMENTS.inc, on_checkout=DB_CHECKOUTS.inc)
