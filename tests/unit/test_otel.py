"""OpenTelemetry traces (dispatch/otel.py): off by default with nothing of it loaded or
installed; on, the pieces that keep ids on spans and text off them. The whole trace of a
turn through a collector is tests/system/test_otel.py."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import temporalio.client
from opentelemetry import baggage, context
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Status, StatusCode

from parley.api.main import create_app
from parley.config import Settings
from parley.contracts import TurnInput
from parley.dispatch.otel import Scrubbed, Telemetry, TurnTracing, traces_url, turn_ids
from parley.dispatch.telemetry import telemetry_for, tracing_on
from parley.gateway.base import Finish, ModelRequest, TextDelta
from parley.gateway.demo import DemoModel
from parley.gateway.registry import ProviderPool

REPO = Path(__file__).resolve().parents[2]
OFF = Settings(database_url="postgresql://unused")
ON = Settings(database_url="postgresql://unused", otlp_endpoint="http://127.0.0.1:9")

# What a process that does not trace must never load: the SDK, the exporter, the
# instrumentation, Temporal's interceptor, Parley's module. (The OpenTelemetry *API* may be
# there: the MCP SDK imports it for its own optional spans.)
HEAVY = (
    "opentelemetry.sdk",
    "opentelemetry.exporter",
    "opentelemetry.instrumentation",
    "temporalio.contrib.opentelemetry",
    "parley.dispatch.otel",
)

PROBE = """
import json, sys
import parley.worker
from parley.api.main import create_app
from parley.config import Settings
app = create_app(Settings(database_url="postgresql://unused"))
print(json.dumps(sorted(m for m in sys.modules if m.startswith(tuple(sys.argv[1:])))))
"""


def test_tracing_off_loads_nothing_of_it() -> None:
    """The API app built and the worker module imported, in a fresh interpreter, with no
    endpoint: none of the tracing modules is imported."""
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *HEAVY],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "PARLEY_OTLP_ENDPOINT": ""},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.splitlines()[-1]) == []


def test_tracing_off_installs_nothing() -> None:
    assert telemetry_for(OFF, "parley-api") is None
    assert tracing_on(object(), OFF) is None  # type: ignore[arg-type]  # never looked at
    app = create_app(OFF)
    assert app.state.telemetry is None
    assert not getattr(app, "_is_instrumented_by_opentelemetry", False)


@pytest.fixture
def traced_app() -> Iterator[Telemetry]:
    app = create_app(ON)
    telemetry = app.state.telemetry
    assert isinstance(telemetry, Telemetry)
    assert app._is_instrumented_by_opentelemetry  # FastAPIInstrumentor's own mark
    yield telemetry
    telemetry.shutdown()  # nothing was traced: nothing is sent


def test_tracing_on_instruments_the_app_and_the_temporal_client(traced_app: Telemetry) -> None:
    assert isinstance(traced_app.interceptor, TurnTracing)
    assert traces_url("http://collector:4318/") == "http://collector:4318/v1/traces"
    assert traces_url("http://collector:4318/v1/traces") == "http://collector:4318/v1/traces"


def _telemetry() -> tuple[Telemetry, InMemorySpanExporter]:
    """Telemetry exporting into memory: its spans are there once it has shut down."""
    spans = InMemorySpanExporter()
    return Telemetry("http://127.0.0.1:9", "parley-test", exporter=spans), spans


def _turn_input() -> TurnInput:
    return TurnInput(
        turn_id="trn_1",
        session_id="ses_1",
        tenant_id="northwind",
        confirmation_timeout_s=60,
    )


def test_a_turns_ids_travel_as_baggage_onto_this_tracers_spans() -> None:
    telemetry, spans = _telemetry()
    ids = turn_ids([_turn_input()])
    assert ids == {
        "parley.turn_id": "trn_1",
        "parley.session_id": "ses_1",
        "parley.tenant_id": "northwind",
    }
    assert turn_ids([object()]) == {} and turn_ids([]) == {}
    carried = context.get_current()
    for key, value in ids.items():
        carried = baggage.set_baggage(key, value, carried)
    token = context.attach(carried)
    try:
        telemetry.tracer.start_span("RunActivity:call_model").end()
        telemetry.provider.get_tracer("someone.else").start_span("theirs").end()
    finally:
        context.detach(token)
    telemetry.shutdown()
    by_name = {span.name: span for span in spans.get_finished_spans()}
    assert len(by_name) == 2
    assert dict(by_name["RunActivity:call_model"].attributes or {}) == ids
    assert not by_name["theirs"].attributes  # another tracer's spans are left as they are


async def test_the_provider_span_names_model_and_tokens_and_no_text() -> None:
    telemetry, spans = _telemetry()
    pool = ProviderPool(OFF, primary=DemoModel(token_delay_s=0), wrap=telemetry.interceptor.traced)
    request = ModelRequest(
        model="demo-1",
        messages=[{"role": "user", "content": "Tell me about yourself, Quillfeather."}],
    )
    events = [event async for event in pool.get("demo").stream(request)]
    telemetry.shutdown()
    answer = "".join(e.text for e in events if isinstance(e, TextDelta))
    finish = events[-1]
    assert isinstance(finish, Finish) and answer
    (span,) = spans.get_finished_spans()
    assert span.name == "chat demo-1"
    attributes = dict(span.attributes or {})
    assert attributes["gen_ai.provider.name"] == "demo"
    assert attributes["gen_ai.usage.output_tokens"] == finish.usage["output_tokens"]
    assert attributes["gen_ai.response.finish_reasons"] == ("stop",)
    texts = json.dumps(attributes)
    assert "Quillfeather" not in texts and answer not in texts


def test_the_exporter_drops_who_asked_and_the_query_string() -> None:
    spans = InMemorySpanExporter()
    request = ReadableSpan(
        name="GET /v1/sessions/{session_id}/messages",
        attributes={
            "http.url": "http://api/v1/sessions/ses_1/messages?after_seq=3&note=hello",
            "http.target": "/v1/sessions/ses_1/messages?after_seq=3",
            "http.route": "/v1/sessions/{session_id}/messages",
            "net.peer.ip": "203.0.113.7",
            "http.user_agent": "Mozilla/5.0",
        },
    )
    failed = ReadableSpan(
        name="RunActivity:execute_tool",
        status=Status(StatusCode.ERROR, "IntegrityError: [parameters: ('my card is 4111',)]"),
        events=[
            Event(
                "exception",
                {
                    "exception.type": "IntegrityError",
                    "exception.message": "[parameters: ('my card is 4111',)]",
                    "exception.stacktrace": "Traceback ... my card is 4111",
                },
            )
        ],
    )
    untouched = ReadableSpan(name="StartWorkflow:TurnWorkflow", attributes={"a": "b"})
    Scrubbed(spans).export([request, failed, untouched])
    sent, sent_failure, sent_untouched = spans.get_finished_spans()
    assert dict(sent.attributes or {}) == {
        "http.url": "http://api/v1/sessions/ses_1/messages",
        "http.target": "/v1/sessions/ses_1/messages",
        "http.route": "/v1/sessions/{session_id}/messages",
    }
    assert sent_failure.status.description == "IntegrityError"
    assert [dict(e.attributes or {}) for e in sent_failure.events] == [
        {"exception.type": "IntegrityError"}
    ]
    assert sent_untouched is untouched


def _request_span(telemetry: Telemetry, name: str) -> Any:
    """A request's span as FastAPI's instrumentation makes it (its own tracer)."""
    tracer = telemetry.provider.get_tracer("opentelemetry.instrumentation.fastapi")
    return tracer.start_as_current_span(name)


class _Started(Exception):
    """What the stub Temporal client answers a start with, once it has looked at it."""


class _StubOutbound(temporalio.client.OutboundInterceptor):
    """The end of the client's interceptor chain: records what a start would have sent."""

    def __init__(self) -> None:
        self.headers: dict[str, Any] = {}

    async def start_workflow(self, input: Any) -> Any:
        self.headers = dict(input.headers)
        raise _Started

    async def signal_workflow(self, input: Any) -> None:
        self.headers = dict(input.headers)
        raise _Started


def _start_input() -> Any:
    return SimpleNamespace(
        args=[_turn_input()],
        workflow="TurnWorkflow",
        id="turn-trn_1",
        start_signal=None,
        headers={},
    )


@pytest.mark.parametrize("from_a_request", [True, False], ids=["post", "outbox sweep"])
async def test_a_turn_start_carries_the_turns_ids_and_only_them(from_a_request: bool) -> None:
    telemetry, spans = _telemetry()
    stub = _StubOutbound()
    chain = telemetry.interceptor.intercept_client(stub)
    # A caller's own baggage (from a request's `baggage` header) must not reach the workflow.
    token = context.attach(baggage.set_baggage("note", "hello there"))
    try:
        if from_a_request:
            with _request_span(telemetry, "POST /v1/sessions/{session_id}/messages"):
                with pytest.raises(_Started):
                    await chain.start_workflow(_start_input())
        else:
            with pytest.raises(_Started):
                await chain.start_workflow(_start_input())
    finally:
        context.detach(token)
    telemetry.shutdown()
    carried = telemetry.interceptor.payload_converter.from_payloads([stub.headers["_tracer-data"]])
    sent = carried[0]["baggage"]
    assert "note" not in sent and "parley.turn_id=trn_1" in sent, sent
    by_name = {span.name: span for span in spans.get_finished_spans()}
    start = by_name["StartWorkflow:TurnWorkflow"]
    assert (start.attributes or {})["parley.turn_id"] == "trn_1"
    if from_a_request:  # the request's span names the turn and is the start's parent
        post = by_name["POST /v1/sessions/{session_id}/messages"]
        assert (post.attributes or {})["parley.session_id"] == "ses_1"
        assert start.parent is not None and start.parent.span_id == post.context.span_id
    else:  # the sweep's start begins the turn's trace
        assert start.parent is None


async def test_a_signal_from_a_request_carries_none_of_its_baggage() -> None:
    telemetry, spans = _telemetry()
    stub = _StubOutbound()
    chain = telemetry.interceptor.intercept_client(stub)
    token = context.attach(baggage.set_baggage("parley.turn_id", "trn_not_theirs"))
    try:
        with _request_span(telemetry, "POST /v1/sessions/{session_id}/actions"):
            signal = SimpleNamespace(signal="resolve_action", id="turn-trn_1", headers={})
            with pytest.raises(_Started):
                await chain.signal_workflow(signal)
    finally:
        context.detach(token)
    telemetry.shutdown()
    carried = telemetry.interceptor.payload_converter.from_payloads([stub.headers["_tracer-data"]])
    assert "baggage" not in carried[0] and "traceparent" in carried[0], carried
    named = [dict(span.attributes or {}) for span in spans.get_finished_spans()]
    assert len(named) == 2 and not [a for a in named if "parley.turn_id" in a], named
