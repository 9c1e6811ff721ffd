"""A stand-in for an OpenTelemetry collector: an ASGI app that accepts OTLP/HTTP protobuf
exports at `/v1/traces`, decodes them with the OTLP protobuf types and keeps every span, so a
test can read what Parley's processes exported."""

from __future__ import annotations

import gzip
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request, Response
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue


@dataclass(frozen=True)
class ExportedSpan:
    service: str
    trace_id: str
    span_id: str
    parent_id: str | None
    name: str
    attributes: dict[str, Any]
    # Everything else the span carried as text: its events' names and attributes, its
    # status message, its resource's attributes.
    extra: list[Any] = field(default_factory=list)

    def texts(self) -> list[str]:
        """Every string this span exported, nested values flattened."""
        return [self.name, *_strings(list(self.attributes.values())), *_strings(self.extra)]


class Collector:
    """What the exporters posted (`spans`), and the app they post it to (`app`)."""

    def __init__(self) -> None:
        self.spans: list[ExportedSpan] = []
        self.app = FastAPI()
        self.app.post("/v1/traces")(self._receive)

    async def _receive(self, request: Request) -> Response:
        body = await request.body()
        if request.headers.get("content-encoding") == "gzip":
            body = gzip.decompress(body)
        self.spans.extend(decode(ExportTraceServiceRequest.FromString(body)))
        return Response(
            ExportTraceServiceResponse().SerializeToString(),
            media_type="application/x-protobuf",
        )

    def trace(self, trace_id: str) -> list[ExportedSpan]:
        return [span for span in self.spans if span.trace_id == trace_id]


def decode(request: ExportTraceServiceRequest) -> list[ExportedSpan]:
    spans: list[ExportedSpan] = []
    for resource_spans in request.resource_spans:
        resource = _attributes(resource_spans.resource.attributes)
        service = str(resource.get("service.name", ""))
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                events = [[e.name, _attributes(e.attributes)] for e in span.events]
                spans.append(
                    ExportedSpan(
                        service=service,
                        trace_id=span.trace_id.hex(),
                        span_id=span.span_id.hex(),
                        parent_id=span.parent_span_id.hex() or None,
                        name=span.name,
                        attributes=_attributes(span.attributes),
                        extra=[events, span.status.message, resource],
                    )
                )
    return spans


def _attributes(pairs: Any) -> dict[str, Any]:
    return {pair.key: _value(pair.value) for pair in pairs if isinstance(pair, KeyValue)}


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return _attributes(value.kvlist_value.values)
    if kind == "bytes_value":
        return value.bytes_value.decode("utf-8", "replace")
    return getattr(value, kind) if kind else None


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [*value.keys(), *_strings(list(value.values()))]
    if isinstance(value, list | tuple):
        return [text for item in value for text in _strings(item)]
    return []
