"""The one switch for OpenTelemetry traces: `PARLEY_OTLP_ENDPOINT` set, a process builds its
`Telemetry` (dispatch/otel.py); unset, these return None and OpenTelemetry is never imported,
so a process that does not trace pays nothing for it."""

from __future__ import annotations

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
