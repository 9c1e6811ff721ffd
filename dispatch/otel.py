"""OpenTelemetry traces for operators: one trace per turn, from the API's POST through the
turn's workflow, each of its steps (local ones too) and the provider call, exported over
OTLP/HTTP to the collector at `PARLEY_OTLP_ENDPOINT`.

This module is imported only when that setting is set (api/main.py, worker.py): with it
unset no OpenTelemetry package is loaded, no interceptor or middleware is installed, and a
turn pays nothing.

What is traced, and by whom:

- the API's requests: FastAPI's instrumentation (`Telemetry.instrument`), without its
  per-message `send`/`receive` spans (an event stream would be a span per frame);
- every start, signal and update the API sends to Temporal, the workflow's own spans and
  every activity attempt: Temporal's `TracingInterceptor`, on the Temporal client (a worker
  takes it from its client). It carries the context through the start's headers, so the
  workflow joins the request's trace;
- the provider call: `TracedProvider`, a span around the gateway's stream (provider, model,
  token counts).

The turn, session and tenant ids ride along as W3C baggage, set where a turn's workflow is
started (`TurnTracing`); every span of this tracer started under them carries them as
`parley.turn_id`, `parley.session_id` and `parley.tenant_id` (`IdsFromBaggage`). Nothing
here records text: no prompt, message or answer, no request body or header, and the
exporter drops query strings, client addresses, user agents and exception messages
(`Scrubbed`).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import temporalio.client
from opentelemetry import baggage, context, trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan, Span, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from temporalio.contrib.opentelemetry import TracingInterceptor

from parley.gateway.base import Finish, ModelProvider, ModelRequest, StreamEvent, reads_ahead

if TYPE_CHECKING:
    from fastapi import FastAPI

# The tracer of Parley's own spans and of Temporal's interceptor: the ids are copied onto
# its spans only (a request's baggage from outside names no turn of ours).
TRACER = "parley"
IDS = ("turn_id", "session_id", "tenant_id")
PREFIX = "parley."
# Only the span's context crosses to the worker that starts a posted turn (not the request's
# baggage): W3C trace context alone.
_TRACE_CONTEXT = TraceContextTextMapPropagator()

# Request attributes the exporter never sends: who asked from where, and the query string.
DROPPED = frozenset(
    {
        "client.address",
        "client.port",
        "net.peer.ip",
        "net.peer.port",
        "http.client_ip",
        "http.user_agent",
        "user_agent.original",
        "url.query",
    }
)
# Attributes that hold a URL or target: kept without their query string.
URLS = frozenset({"http.url", "url.full", "http.target"})
# Requests not worth a trace: probes, scrapes and the page's static files.
EXCLUDED_URLS = "/healthz,/readyz,/metrics,/static/"


class Telemetry:
    """The process's tracer provider, exporting in batches to the collector, and the pieces
    that use it."""

    def __init__(self, endpoint: str, service: str, exporter: SpanExporter | None = None) -> None:
        # OTEL_SERVICE_NAME, when set, names the service instead.
        name = os.environ.get("OTEL_SERVICE_NAME") or service
        self.provider = TracerProvider(resource=Resource.create({"service.name": name}))
        self.provider.add_span_processor(IdsFromBaggage())
        target = exporter or OTLPSpanExporter(endpoint=traces_url(endpoint))
        self.provider.add_span_processor(BatchSpanProcessor(Scrubbed(target)))
        self.tracer = self.provider.get_tracer(TRACER)
        # For the Temporal client: a worker built on that client takes it from there.
        self.interceptor = TurnTracing(self.tracer)

    def instrument(self, app: FastAPI) -> None:
        """Trace the API's requests (each one a span; no body or header is recorded)."""
        from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor
        from opentelemetry.metrics import NoOpMeterProvider

        FastAPIInstrumentor.instrument_app(
            app,
            tracer_provider=self.provider,
            meter_provider=NoOpMeterProvider(),  # the API's metrics are Prometheus's
            excluded_urls=EXCLUDED_URLS,
            exclude_spans=["receive", "send"],
        )

    def shutdown(self) -> None:
        """Export what is still batched, then stop (a process's last spans are not lost)."""
        self.provider.shutdown()


def traces_url(endpoint: str) -> str:
    """The collector's traces path under its base URL, as the OTLP/HTTP convention has it."""
    base = endpoint.rstrip("/")
    return base if base.endswith("/v1/traces") else f"{base}/v1/traces"


def current_trace_id() -> str | None:
    """The trace the running code is part of (32 hex digits), or None outside one."""
    span_context = trace.get_current_span().get_span_context()
    return format(span_context.trace_id, "032x") if span_context.is_valid else None


def traceparent_here() -> str:
    """The running span's context (the POST's, whose turn a worker starts) as a W3C
    `traceparent`, for that start to join (`joined`)."""
    carrier: dict[str, str] = {}
    _TRACE_CONTEXT.inject(carrier)
    return carrier.get("traceparent", "")


def name_span(ids: dict[str, str]) -> None:
    """Name the running span (the POST's) with the turn's ids, as its start would have."""
    trace.get_current_span().set_attributes(ids)


@contextmanager
def joined(traceparent: str) -> Iterator[None]:
    """Run as part of the trace `traceparent` names (a POST's, in the worker that starts its
    turn): the start's spans are its children."""
    token = context.attach(_TRACE_CONTEXT.extract({"traceparent": traceparent}))
    try:
        yield
    finally:
        context.detach(token)


def tracing_of(client: temporalio.client.Client) -> TurnTracing | None:
    """The tracing interceptor a Temporal client was connected with, if any."""
    for interceptor in client.config()["interceptors"]:
        if isinstance(interceptor, TurnTracing):
            return interceptor
    return None


class TurnTracing(TracingInterceptor):
    """Temporal's interceptor, plus the turn's ids wherever a turn's workflow is started:
    on the span that starts it (the POST's) and in the baggage the start carries."""

    def __init__(self, tracer: trace.Tracer) -> None:
        super().__init__(tracer)

    def traced(self, provider: ModelProvider) -> ModelProvider:
        """`provider` with a span around each of its calls."""
        return TracedProvider(provider, self.tracer)

    @staticmethod
    def trace_id() -> str | None:
        return current_trace_id()

    def intercept_client(
        self, next: temporalio.client.OutboundInterceptor
    ) -> temporalio.client.OutboundInterceptor:
        return _TurnIds(super().intercept_client(next))


class _TurnIds(temporalio.client.OutboundInterceptor):
    """Only the turn's ids travel into Temporal's headers as baggage: a request's own baggage
    (its `baggage` header, from outside) reaches no workflow, nor any span's attributes."""

    async def start_workflow(
        self, input: temporalio.client.StartWorkflowInput
    ) -> temporalio.client.WorkflowHandle[Any, Any]:
        ids = turn_ids(input.args)
        if not ids:  # not a turn (a summary, started by a turn's step: its ids go on)
            return await super().start_workflow(input)
        # The request's span (none in the outbox sweep, whose start begins the turn's trace).
        trace.get_current_span().set_attributes(ids)
        with _carrying(ids):
            return await super().start_workflow(input)

    async def signal_workflow(self, input: temporalio.client.SignalWorkflowInput) -> None:
        with _carrying({}):  # the workflow's spans name the turn from its start
            await super().signal_workflow(input)

    async def start_workflow_update(
        self, input: temporalio.client.StartWorkflowUpdateInput
    ) -> temporalio.client.WorkflowUpdateHandle[Any]:
        with _carrying({}):
            return await super().start_workflow_update(input)


@contextmanager
def _carrying(ids: dict[str, str]) -> Iterator[None]:
    """Run with `ids` as the only baggage."""
    carried = baggage.clear(context.get_current())
    for key, value in ids.items():
        carried = baggage.set_baggage(key, value, carried)
    token = context.attach(carried)
    try:
        yield
    finally:
        context.detach(token)


def turn_ids(args: Sequence[Any]) -> dict[str, str]:
    """`parley.turn_id`, `parley.session_id`, `parley.tenant_id` of a turn's workflow input."""
    first = args[0] if args else None
    ids = {f"{PREFIX}{name}": getattr(first, name, None) for name in IDS}
    if not all(isinstance(value, str) for value in ids.values()):
        return {}
    return {key: str(value) for key, value in ids.items()}


class IdsFromBaggage(SpanProcessor):
    """Copies the turn's ids from the baggage a span starts under onto the span."""

    def on_start(self, span: Span, parent_context: context.Context | None = None) -> None:
        scope = span.instrumentation_scope
        if scope is None or scope.name != TRACER:
            return
        for key, value in baggage.get_all(parent_context).items():
            if key.startswith(PREFIX) and isinstance(value, str):
                span.set_attribute(key, value)


class Scrubbed(SpanExporter):
    """An exporter that sends every span without the attributes in `DROPPED` and with URLs
    cut at their query string."""

    def __init__(self, inner: SpanExporter) -> None:
        self._inner = inner

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return self._inner.export([scrubbed(span) for span in spans])

    def shutdown(self) -> None:
        self._inner.shutdown()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return self._inner.force_flush(timeout_millis)


def scrubbed(span: ReadableSpan) -> ReadableSpan:
    """`span` as it may leave the process. An exception's message can quote anything (a
    statement's parameters, a provider's error body): a failure keeps its type only, in the
    span's status and in its exception events."""
    attributes = dict(span.attributes or {})
    kept = {
        key: value.split("?", 1)[0] if key in URLS and isinstance(value, str) else value
        for key, value in attributes.items()
        if key not in DROPPED
    }
    events = [
        Event(event.name, {"exception.type": _exception_type(event)}, event.timestamp)
        if event.name == "exception"
        else event
        for event in span.events
    ]
    status = span.status
    if status.description:
        status = Status(status.status_code, status.description.split(":", 1)[0])
    if kept == attributes and events == list(span.events) and status is span.status:
        return span
    return ReadableSpan(
        name=span.name,
        context=span.context,
        parent=span.parent,
        resource=span.resource,
        attributes=kept,
        events=events,
        links=span.links,
        kind=span.kind,
        status=status,
        start_time=span.start_time,
        end_time=span.end_time,
        instrumentation_scope=span.instrumentation_scope,
    )


def _exception_type(event: Event) -> str:
    kind = (event.attributes or {}).get("exception.type", "")
    return kind if isinstance(kind, str) else ""


class TracedProvider:
    """A provider whose every call is a span: provider, model, output cap, and the token
    counts once the call finishes. The request's messages are never looked at."""

    def __init__(self, inner: ModelProvider, tracer: trace.Tracer) -> None:
        self.name = inner.name
        self.reads_ahead = reads_ahead(inner)
        self._inner = inner
        self._tracer = tracer

    async def aclose(self) -> None:
        close = getattr(self._inner, "aclose", None)
        if close is not None:
            await close()

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
        # Not made current: the caller iterates this stream across its own awaits.
        span = self._tracer.start_span(
            f"chat {request.model}",
            kind=SpanKind.CLIENT,
            attributes={
                "gen_ai.operation.name": "chat",
                "gen_ai.provider.name": self.name,
                "gen_ai.request.model": request.model,
                "gen_ai.request.max_tokens": request.max_output_tokens,
            },
        )
        try:
            async for event in self._inner.stream(request):
                if isinstance(event, Finish):
                    span.set_attributes(usage_attributes(event))
                yield event
        except GeneratorExit:  # the caller stopped reading (a Stop): not a failure
            raise
        except BaseException as exc:
            span.set_status(Status(StatusCode.ERROR, type(exc).__name__))  # no message text
            raise
        finally:
            span.end()


def usage_attributes(finish: Finish) -> dict[str, Any]:
    usage = finish.usage
    attributes: dict[str, Any] = {"gen_ai.response.finish_reasons": [finish.reason]}
    for key, name in (
        ("input_tokens", "gen_ai.usage.input_tokens"),
        ("output_tokens", "gen_ai.usage.output_tokens"),
        ("cached_tokens", "gen_ai.usage.cache_read.input_tokens"),
    ):
        if key in usage:
            attributes[name] = usage[key]
    return attributes
