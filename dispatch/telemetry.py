"""The one switch for OpenTelemetry traces: `PARLEY_OTLP_ENDPOINT` set, a process builds its
`Telemetry` (dispatch/otel.py); unset, these return None and OpenTelemetry is never imported,
so a process that does not trace pays nothing for it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from temporalio.client import Client

from parley.config import Settings

if TYPE_CHECKING:
    from parley.dispatch.otel import Telemetry, TurnTracing


def telemetry_for(settings: Settings, service: str) -> Telemetry | None:
    """This process's tracer provider and exporter, `service` naming it; None when off."""
    if not settings.otlp_endpoint:
        return None
    from parley.dispatch.otel import Telemetry

    return Telemetry(settings.otlp_endpoint, service)


def tracing_on(client: Client, settings: Settings) -> TurnTracing | None:
    """The tracing interceptor `client` was connected with, if tracing is on; a worker built
    on that client traces its workflows and steps through it."""
    if not settings.otlp_endpoint:
        return None
    from parley.dispatch.otel import tracing_of

    return tracing_of(client)


def post_trace(settings: Settings) -> str:
    """The POST's trace context, for the worker that starts its turn (`joined_trace`);
    empty when tracing is off."""
    if not settings.otlp_endpoint:
        return ""
    from parley.dispatch.otel import traceparent_here

    return traceparent_here()


def name_post(settings: Settings, *, turn_id: str, session_id: str, tenant_id: str) -> None:
    """Name the POST's span with the turn it made (its start, in a worker, names its own)."""
    if settings.otlp_endpoint:
        from parley.dispatch.otel import name_span, turn_ids

        name_span(turn_ids([_Ids(turn_id, session_id, tenant_id)]))


@contextmanager
def joined_trace(traceparent: str) -> Iterator[None]:
    """Run as part of the trace a POST's `traceparent` names (empty: as it is). Only a
    process that traces passes one (OpenTelemetry is imported then)."""
    if not traceparent:
        yield
        return
    from parley.dispatch.otel import joined

    with joined(traceparent):
        yield


@dataclass(frozen=True)
class _Ids:
    turn_id: str
    session_id: str
    tenant_id: str
