"""Prometheus metrics exposed at /metrics."""

from __future__ import annotations

from prometheus_client import Counter, Gauge
from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine

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


def count_database_work(engine: AsyncEngine) -> None:
    """Count the engine's statements and pool checkouts (the bench reports them per turn)."""
    event.listen(engine.sync_engine, "before_cursor_execute", _statement)
    event.listen(engine.sync_engine.pool, "checkout", _checkout)


def _statement(*_: object) -> None:
    DB_STATEMENTS.inc()


def _checkout(*_: object) -> None:
    DB_CHECKOUTS.inc()
