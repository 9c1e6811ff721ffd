"""Prometheus metrics exposed at /metrics."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

MESSAGES_POSTED = Counter(
    "parley_messages_posted_total", "User messages posted, by outcome", ["outcome"]
)
TURN_START_FAILURES = Counter(
    "parley_turn_start_failures_total",
    "Workflow starts the API could not make (the worker's outbox sweep starts them)",
)
STREAMS_OPEN = Gauge("parley_event_streams_open", "Event streams currently open")
EVENTS_SENT = Counter("parley_events_sent_total", "Events written to SSE clients")
