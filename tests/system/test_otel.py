"""OpenTelemetry traces (issue 30, acceptance 7): with an OTLP endpoint configured, one turn is
one trace whose spans cover the API's POST, the workflow, each of its steps (local ones too)
and the provider call over HTTP, each naming the turn, and no span holds the message's text
or the answer's.

The stack is its own: a collector stand-in (tests/support/otlp.py), the fake provider over
HTTP in brain mode (the demo's answers through the real OpenAI SDK, with a tool call), a
worker process with `PARLEY_OTLP_ENDPOINT` set, and the API in this process with the same.
Both export when they stop (their tracer providers flush on shutdown); the test then reads
the collector, polling with a deadline. A second test takes the eager path: an API that runs
its own worker (`PARLEY_API_WORKER`) and starts the turn on that worker's client.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy import select

from parley.config import Settings
from parley.gateway.fake_provider.server import FakeProvider
from parley.store.db import Database
from parley.store.models import TraceSpan
from tests.support.client import ParleyClient, streamed_text
from tests.support.orm import orm
from tests.support.otlp import Collector, ExportedSpan
from tests.support.sse import Event
from tests.support.stack import own_queue, serve, serve_api, service_env
from tests.support.zygote import Forked, fork_worker

# A question the demo answers with a tool call first; its last word is found nowhere else.
QUESTION = "Where is my order? Kestrelwood"
FOLLOW_UP = "Thanks, and what can you do about returns?"
DEADLINE_S = 60.0

# The parts of a model step (activities/opening.py): spans in the ledger, not activities.
STEP_PARTS = {"build_context", "screen_input", "call_model"}
# Every turn's trace holds these: the POST, the workflow's start and its run.
TURN_SPANS = (
    "POST /v1/sessions/{session_id}/messages",
    "StartWorkflow:TurnWorkflow",
    "RunWorkflow:TurnWorkflow",
)


async def _until(what: str, check: Callable[[], bool], deadline_s: float = DEADLINE_S) -> None:
    deadline = time.monotonic() + deadline_s
    while not check():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        await asyncio.sleep(0.1)


async def _stop(process: Forked) -> None:
    """SIGTERM (a worker drains, flushes its spans and leaves), waited for without blocking
    the loop the collector answers on."""
    process.terminate()
    await _until("the worker to stop", lambda: process.poll() is not None)
    assert process.returncode == 0, process.returncode


async def test_one_turn_is_one_trace_without_message_text(
    settings: Settings,
    tokens: dict[str, str],
    sessions: Database,
) -> None:
    # Tokens 20 ms apart: the tool turn outlasts the post queued behind it by far.
    collector, fake = Collector(), FakeProvider(brain=True, token_delay_s=0.02)
    async with serve(collector.app) as collector_url, serve(fake.app) as fake_url:
        own = own_queue(settings, "otel", otlp_endpoint=collector_url)
        worker = fork_worker(
            service_env(
                own,
                PARLEY_OTLP_ENDPOINT=collector_url,
                PARLEY_MODEL_PROVIDER="openai",
                OPENAI_BASE_URL=f"{fake_url}/v1",
                OPENAI_API_KEY="fake-key",
                PARLEY_WORKER_SHUTDOWN_GRACE_S="10",
            )
        )
        try:
            async with serve_api(own) as api_url:
                client = ParleyClient(api_url, tokens["priya"])
                try:
                    session_id = await client.new_session()
                    # The worker may not be listening yet: the sweep starts a turn it did not
                    # hear, in a trace of its own (docs/operations.md). Once a turn has
                    # ended, it listens: the next one's start joins the POST's trace.
                    _, first = await client.turn(session_id, "Tell me about yourself, please.")
                    assert first[-1].type == "done"
                    posted = await client.post(session_id, QUESTION)
                    turn_id = posted.json()["turn_id"]
                    # Posted while that answer runs: queued, promoted when it ends.
                    queued = await client.post(session_id, FOLLOW_UP)
                    assert queued.json()["state"] == "queued", queued.text
                    events = await client.events(session_id, turn_id)
                    queued_id = queued.json()["turn_id"]
                    followed = await client.events(session_id, queued_id)
                finally:
                    await client.aclose()
            await _stop(worker)  # the API has stopped (and flushed) already
        finally:
            if worker.poll() is None:
                worker.kill()
                worker.wait(10)
        await _check_turn(collector, sessions, session_id, turn_id, events, provider="openai")
        services = {s.service for s in collector.spans if s.attributes.get("parley.turn_id")}
        assert services == {"parley-api", "parley-worker"}, services
        await _check_queued_turn(collector, queued_id, followed)
        _check_no_text(collector.spans, [FOLLOW_UP, streamed_text(followed)])


async def test_an_eager_start_in_an_api_that_runs_a_worker_is_one_trace_too(
    settings: Settings,
    tokens: dict[str, str],
    sessions: Database,
) -> None:
    """`PARLEY_API_WORKER`: the API starts the turn eagerly on its own client, whose worker
    runs it (the demo model); the one process exports the whole trace."""
    collector = Collector()
    async with serve(collector.app) as collector_url:
        own = own_queue(settings, "otel-eager", otlp_endpoint=collector_url, api_worker=True)
        async with serve_api(own) as api_url:
            client = ParleyClient(api_url, tokens["priya"])
            try:
                session_id = await client.new_session()
                turn_id, events = await client.turn(session_id, QUESTION)
            finally:
                await client.aclose()
        await _check_turn(collector, sessions, session_id, turn_id, events, provider="demo")


async def _check_turn(
    collector: Collector,
    sessions: Database,
    session_id: str,
    turn_id: str,
    events: list[Event],
    *,
    provider: str,
) -> None:
    assert events[-1].type == "done", [e.type for e in events]
    answer = streamed_text(events)
    ledger = await _ledger(sessions, turn_id)
    steps = {row.name for row in ledger}
    # A local step and a regular one are among them (a model step and the tool call); the
    # ledger records the model step's parts as well, which are no activities of their own.
    assert {"open_step", "build_context", "call_model", "execute_tool"} <= steps, steps
    expected = {"chat demo-1", *(f"RunActivity:{name}" for name in steps - STEP_PARTS)}
    spans = await _turn_spans(collector, turn_id, expected)
    _check_one_trace(collector, spans, ledger, session_id)
    _check_provider_span(spans, provider)
    _check_no_text(collector.spans, [QUESTION, "Kestrelwood", answer])


async def _turn_spans(collector: Collector, turn_id: str, expected: set[str]) -> list[ExportedSpan]:
    """The turn's spans once the collector holds the POST's, the workflow's start and run,
    and the `expected` ones."""
    expected = {*TURN_SPANS, *expected}

    def turn_spans() -> list[ExportedSpan]:
        return [s for s in collector.spans if s.attributes.get("parley.turn_id") == turn_id]

    await _until(f"spans {expected}", lambda: expected <= {s.name for s in turn_spans()})
    return turn_spans()


async def _check_queued_turn(collector: Collector, turn_id: str, events: list[Event]) -> None:
    """A queued turn's trace starts at the POST that queued it (its ring carries the POST's
    trace context, store/queue.py) and runs through the worker's start and steps."""
    assert events[-1].type == "done", [e.type for e in events]
    spans = await _turn_spans(collector, turn_id, {"RunActivity:open_step"})
    (trace_id,) = {span.trace_id for span in spans}
    roots = [span for span in collector.trace(trace_id) if span.parent_id is None]
    assert [(r.name, r.attributes.get("parley.turn_id")) for r in roots] == [
        ("POST /v1/sessions/{session_id}/messages", turn_id)
    ], roots


async def _ledger(sessions: Database, turn_id: str) -> list[TraceSpan]:
    async with orm(sessions) as db:
        rows = await db.scalars(select(TraceSpan).where(TraceSpan.turn_id == turn_id))
        return list(rows)


def _check_one_trace(
    collector: Collector, spans: list[ExportedSpan], ledger: list[TraceSpan], session_id: str
) -> None:
    trace_ids = {span.trace_id for span in spans}
    assert len(trace_ids) == 1, trace_ids
    (trace_id,) = trace_ids
    whole = collector.trace(trace_id)
    # One tree: the POST's span is its root, every other span's parent is in the trace.
    roots = [span for span in whole if span.parent_id is None]
    assert [root.name for root in roots] == ["POST /v1/sessions/{session_id}/messages"], roots
    ids = {span.span_id for span in whole}
    assert all(span.parent_id in ids for span in whole if span.parent_id), "orphan spans"
    # The ids on each span of the turn; the POST's names the request's path with ids only.
    for span in spans:
        assert span.attributes["parley.session_id"] == session_id, span
        assert span.attributes["parley.tenant_id"] == "northwind", span
    post = roots[0]
    assert post.attributes.get("http.target", f"/v1/sessions/{session_id}/messages") == (
        f"/v1/sessions/{session_id}/messages"
    )
    # The app's own ledger names the trace on every row.
    assert ledger and {row.otel_trace_id for row in ledger} == {trace_id}


def _check_provider_span(spans: list[ExportedSpan], provider: str) -> None:
    calls = [span for span in spans if span.name.startswith("chat ")]
    assert len(calls) >= 2, calls  # the tool call, then the answer
    by_id = {span.span_id: span for span in spans}
    for call in calls:
        assert by_id[call.parent_id or ""].name == "RunActivity:open_step"
        assert call.attributes["gen_ai.provider.name"] == provider
        assert call.attributes["gen_ai.request.model"] == "demo-1"
        assert call.attributes["gen_ai.usage.output_tokens"] > 0


def _check_no_text(spans: list[ExportedSpan], secrets: list[str]) -> None:
    assert all(secrets), "nothing to look for"
    found: list[Any] = [
        (span.name, secret)
        for span in spans
        for text in span.texts()
        for secret in secrets
        if secret in text
    ]
    assert not found, found
