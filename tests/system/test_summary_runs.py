"""One summary run per session at a time (issue 26): a finished turn starts the session's
summary workflow or signals the run under way; asks that arrive during a pass cost one more
pass, not one each; a summarizer that keeps failing costs a bounded number of requests per
run, not one retried workflow per turn.

The workflow alone (a stub step on a worker of its own) shows the coalescing and the bounds
exactly; the whole stack (real turns, the real start path and summarizer step, PostgreSQL
and the Temporal dev server) shows the wiring.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import func, select
from temporalio import activity
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowFailureError, WorkflowHandle
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.exceptions import ApplicationError
from temporalio.worker import Worker

from parley.activities.memory import MemoryActivities
from parley.config import Settings
from parley.contracts import SUMMARY_DUE_SIGNAL, SUMMARY_WORKFLOW, SummarizeInput, SummarizeResult
from parley.dispatch.runner import one_batch_per_task
from parley.gateway.base import Finish, ModelRequest, StreamEvent, TextDelta
from parley.gateway.demo import DemoModel
from parley.gateway.errors import ProviderRetryable
from parley.gateway.registry import ProviderPool
from parley.ids import summary_workflow_id
from parley.memory import is_summary_request
from parley.prompt import StoredSummary
from parley.store import memory as memory_store
from parley.store.db import Database
from parley.store.models import ConversationSummary
from parley.workflows.options import SUMMARY
from parley.workflows.summary import PASSES_PER_RUN, SummaryWorkflow
from tests.support.client import ParleyClient
from tests.support.histories import HISTORIES, replayer, scrub
from tests.support.orm import orm
from tests.support.summary_runs import run_settled, turn_closed
from tests.support.toolkit import eventually, own_stack

ATTEMPTS = SUMMARY.retry.maximum_attempts
DEADLINE_S = 20.0

# --- the workflow alone -------------------------------------------------------------------------


class Summarizing:
    """The summary step under its real name: records each call, holds the first until
    released, and fails every call while `failing`."""

    def __init__(self) -> None:
        self.calls: list[SummarizeInput] = []
        self.entered = asyncio.Event()
        self.release = asyncio.Event()
        self.failing = False
        # Awaited in each call: what happens while the pass runs (a turn that asks).
        self.during: Callable[[], Awaitable[None]] | None = None

    @activity.defn(name="summarize")
    async def summarize(self, inp: SummarizeInput) -> SummarizeResult:
        self.calls.append(inp)
        if self.during is not None:
            await self.during()
        if self.failing:
            raise ApplicationError("the provider is down", type="provider_unavailable")
        if len(self.calls) == 1:
            self.entered.set()
            await self.release.wait()
        return SummarizeResult(len(self.calls), summarized=True)


@asynccontextmanager
async def summary_worker(client: Client, step: Summarizing) -> AsyncIterator[str]:
    queue = f"sumruns-{uuid.uuid4().hex[:8]}"
    worker = Worker(
        client, task_queue=queue, workflows=[SummaryWorkflow], activities=[step.summarize]
    )
    async with one_batch_per_task(worker):
        yield queue


async def ask(
    client: Client,
    queue: str,
    session_id: str,
    turn_id: str,
    *,
    local: bool = False,
    delay: timedelta | None = None,
) -> None:
    """What `start_summary` does once it has found work (activities/memory.py)."""
    inp = SummarizeInput(session_id, turn_id, local=local)
    await client.start_workflow(
        SUMMARY_WORKFLOW,
        inp,
        id=summary_workflow_id(session_id=session_id),
        task_queue=queue,
        start_signal=SUMMARY_DUE_SIGNAL,
        start_signal_args=[inp],
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        start_delay=delay,
    )


async def maybe_record(client: Client, session_id: str, run_id: str, shape: str) -> None:
    """Replay the run, and with PARLEY_RECORD_SUMMARY_HISTORY=summary_vN keep its history
    for the replay tests (tests/replay/test_replay.py replays every committed history)."""
    handle = client.get_workflow_handle(summary_workflow_id(session_id=session_id), run_id=run_id)
    history = await handle.fetch_history()
    await replayer(SummaryWorkflow).replay_workflow(history)
    name = os.environ.get("PARLEY_RECORD_SUMMARY_HISTORY")
    if name:
        (HISTORIES / f"{name}_{shape}.json").write_text(scrub(history.to_json()))


def summary_handle(client: Client, session_id: str) -> WorkflowHandle[Any, SummarizeResult]:
    return client.get_workflow_handle(
        summary_workflow_id(session_id=session_id), result_type=SummarizeResult
    )


async def runs(client: Client, session_id: str) -> list[tuple[str, WorkflowExecutionStatus]]:
    """Every run of the session's summary workflow: (run id, status)."""
    query = f'WorkflowId = "{summary_workflow_id(session_id=session_id)}"'
    return [
        (w.run_id, w.status) async for w in client.list_workflows(query) if w.status is not None
    ]


# Both ways a pass runs: a regular activity, and a local one (whose result reaches the server
# only with the run's next command).
BOTH = pytest.mark.parametrize("local", [False, True], ids=["activity", "local"])


def kind(local: bool) -> str:
    return "local" if local else "activity"


@BOTH
async def test_asks_during_a_pass_cost_one_more_pass_not_one_each(
    temporal_client: Client, local: bool
) -> None:
    step = Summarizing()
    session_id = f"ses_{uuid.uuid4().hex[:20]}"
    async with summary_worker(temporal_client, step) as queue:
        await ask(temporal_client, queue, session_id, "trn_1", local=local)
        await asyncio.wait_for(step.entered.wait(), DEADLINE_S)
        for n in (2, 3, 4):  # three turns finish while the first pass is under way
            await ask(temporal_client, queue, session_id, f"trn_{n}", local=local)
        handle = summary_handle(temporal_client, session_id)
        described = await handle.describe()
        assert described.status == WorkflowExecutionStatus.RUNNING
        step.release.set()
        result = await handle.result()
        # The three asks were answered by one more pass, made for the latest turn.
        assert result.passes == 2
        assert [c.turn_id for c in step.calls] == ["trn_1", "trn_4"]
        first_run = described.run_id

        # Nothing was pending, so the run ended; the next ask starts a new run, whose start
        # signal is answered by its first pass alone.
        await ask(temporal_client, queue, session_id, "trn_5", local=local)
        again = await summary_handle(temporal_client, session_id).result()
        assert again.passes == 1
        assert len(step.calls) == 3
        await maybe_record(temporal_client, session_id, first_run, f"coalesced_{kind(local)}")
    seen = await runs(temporal_client, session_id)
    assert len(seen) == 2 and first_run in {run for run, _ in seen}
    assert all(status == WorkflowExecutionStatus.COMPLETED for _, status in seen)


@BOTH
async def test_a_failing_step_costs_bounded_attempts_per_run_however_often_turns_ask(
    temporal_client: Client, local: bool
) -> None:
    step = Summarizing()
    step.failing = True
    session_id = f"ses_{uuid.uuid4().hex[:20]}"
    async with summary_worker(temporal_client, step) as queue:
        await ask(temporal_client, queue, session_id, "trn_1", local=local)
        for n in (2, 3):  # more turns ask while the attempts go on
            await asyncio.sleep(0.3)
            await ask(temporal_client, queue, session_id, f"trn_{n}", local=local)
        handle = temporal_client.get_workflow_handle(summary_workflow_id(session_id=session_id))
        with pytest.raises(WorkflowFailureError):
            await handle.result()
        failed = (await handle.describe()).run_id
        await maybe_record(temporal_client, session_id, failed, f"failed_{kind(local)}")
    # One pass, its attempts spent, ends the run: the asks it leaves cost nothing more here
    # (the next turn's run covers them).
    assert len(step.calls) == ATTEMPTS == 3
    assert len(await runs(temporal_client, session_id)) == 1


async def test_the_start_delay_holds_the_first_pass_until_another_turn_asks(
    temporal_client: Client,
) -> None:
    """The idle delay is the server's start delay, which signal-with-start keeps: the first
    ask's run waits it out, and another turn's ask meanwhile starts the run at once (that
    turn has finished too: the session is idle again)."""
    step = Summarizing()
    step.release.set()
    delay = timedelta(seconds=30)
    session_id = f"ses_{uuid.uuid4().hex[:20]}"
    async with summary_worker(temporal_client, step) as queue:
        await ask(temporal_client, queue, session_id, "trn_1", delay=delay)
        await asyncio.sleep(1.0)
        assert step.calls == []  # held back by the delay
        await ask(temporal_client, queue, session_id, "trn_2", delay=delay)
        result = await asyncio.wait_for(
            summary_handle(temporal_client, session_id).result(), DEADLINE_S
        )
    # One pass for both asks, long before the delay was out.
    assert result.passes == 1
    assert [c.turn_id for c in step.calls] == ["trn_2"]


async def test_a_session_that_keeps_asking_continues_as_new_and_loses_no_ask(
    temporal_client: Client,
) -> None:
    step = Summarizing()
    step.release.set()
    session_id = f"ses_{uuid.uuid4().hex[:20]}"
    asks = PASSES_PER_RUN + 2
    async with summary_worker(temporal_client, step) as queue:
        asked = 1
        await ask(temporal_client, queue, session_id, "trn_1")

        async def one_ask_per_pass() -> None:
            nonlocal asked
            if asked < asks:  # a turn finishes during each pass
                asked += 1
                await ask(temporal_client, queue, session_id, f"trn_{asked}")

        step.during = one_ask_per_pass
        result = await summary_handle(temporal_client, session_id).result()
        [continued] = [
            run
            for run, status in await runs(temporal_client, session_id)
            if status == WorkflowExecutionStatus.CONTINUED_AS_NEW
        ]
        await maybe_record(temporal_client, session_id, continued, "continued")
    assert len(step.calls) == asks  # every ask answered, across the runs
    assert [c.turn_id for c in step.calls] == [f"trn_{n}" for n in range(1, asks + 1)]
    statuses = sorted(s.name for _, s in await runs(temporal_client, session_id))
    assert statuses == ["COMPLETED", "CONTINUED_AS_NEW"]
    assert result.passes == asks - PASSES_PER_RUN


# --- the whole stack ---------------------------------------------------------------------------


class ScriptedSummarizer:
    """The demo model for turns; summary requests are counted by the workflow run that made
    them and answered as the test says: "hold" (until released), "plain" (prose, no JSON,
    as many providers answer), "down" (a transport error), or the demo's own summary."""

    name = "demo"

    def __init__(self) -> None:
        self.demo = DemoModel(token_delay_s=0)
        self.mode = "demo"
        self.requests: Counter[str] = Counter()  # by workflow run id
        self.workflows: set[str] = set()
        self.in_flight = 0
        self.most_in_flight = 0
        self.release = asyncio.Event()

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
        if not is_summary_request(request.messages):
            async for event in self.demo.stream(request):
                yield event
            return
        info = activity.info()
        self.requests[info.workflow_run_id or ""] += 1
        self.workflows.add(info.workflow_id or "")
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            if self.mode == "hold":
                await self.release.wait()
            if self.mode == "plain":
                yield TextDelta("The customer asked about several parcels and a green door.")
                yield Finish("stop", {"input_tokens": 400, "output_tokens": 12})
                return
            if self.mode == "down":
                raise ProviderRetryable("overloaded", provider="demo", code="overloaded")
            async for event in self.demo.stream(request):
                if isinstance(event, Finish):  # a bill the test can recognise
                    event = Finish(event.reason, SUMMARIZER_USAGE)
                yield event
        finally:
            self.in_flight -= 1


SUMMARIZER_USAGE = {"input_tokens": 7001, "output_tokens": 301}


def statement(n: int) -> str:
    return f"Note {n}: please leave my parcels at the green door number {n}."


SMALL = {
    # Passes counted for folding alone: with recall by meaning a pass also embeds, and a
    # turn's ask for vectors of its own messages may add one (tests/system/test_context_cost.py
    # covers the embedding).
    "embeddings": "",
    "summary_start_delay_ms": 0,
    "summary_min_new_tokens": 1,
    "context_conversation_tokens": 300,
    "context_summary_tokens": 4000,  # the cap holds every folded line
}


async def turn(client: ParleyClient, sid: str, n: int) -> str:
    turn_id, events = await client.turn(sid, statement(n))
    assert events[-1].type == "done", events[-1]
    return turn_id


async def test_turns_finishing_during_a_summary_run_share_one_run_and_one_more_pass(
    settings: Settings,
    temporal_client: Client,
    sessions: Database,
    tokens: dict[str, str],
) -> None:
    model = ScriptedSummarizer()
    async with own_stack(
        temporal_client, settings, sessions, model, prefix="sumruns", **SMALL
    ) as stack:
        client = ParleyClient(stack.url, tokens["priya"])
        sid = await client.new_session()
        n = 0
        model.mode = "hold"
        while not model.requests:  # turns until a summary pass is in the summarizer
            n += 1
            assert n <= 12, "no summary run after 12 turns"
            await turn_closed(temporal_client, await turn(client, sid, n))
            await asyncio.sleep(0.2)
        [held_run] = model.requests
        # Three more turns finish while that pass is held; each of them has work to ask for.
        for _ in range(3):
            n += 1
            await turn_closed(temporal_client, await turn(client, sid, n))
        running = [r for r, s in await runs(temporal_client, sid) if s.name == "RUNNING"]
        assert running == [held_run]
        assert model.requests == Counter({held_run: 1})

        model.mode = "demo"
        model.release.set()
        handle = summary_handle(temporal_client, sid)
        result = await handle.result()
        await client.aclose()

    # One run at a time, and the three asks cost one more pass of that run, not three.
    assert model.most_in_flight == 1
    assert model.workflows == {summary_workflow_id(session_id=sid)}
    assert result.passes == 2
    assert model.requests == Counter({held_run: 2})
    # The folded summary covers every message through its end, once; and it left nothing
    # that had left the window by then: a pass now finds nothing to fold.
    async with sessions() as db:
        stored = await memory_store.latest_summary(db, session_id=sid)
    assert isinstance(stored, StoredSummary)
    assert [line.seq for line in stored.lines] == list(range(1, stored.through_seq + 1))
    assert stored.through_seq == result.through_seq
    small = stack.settings
    memory = MemoryActivities(
        sessions=sessions,
        providers=ProviderPool(small, primary=DemoModel(token_delay_s=0)),
        settings=small,
    )
    assert not (await memory.summarize(SummarizeInput(sid, "trn_check"))).summarized


@pytest.mark.parametrize(
    ("mode", "most"),
    [
        # An answer that is not the asked-for JSON: once and one repair per pass, then the
        # code summary is written (each such pass writes one version).
        ("plain", 2),
        ("down", ATTEMPTS),  # a transport error: the pass's few attempts, then the run fails
    ],
)
async def test_a_failing_summarizer_costs_a_bounded_number_of_requests_per_run(
    settings: Settings,
    temporal_client: Client,
    sessions: Database,
    tokens: dict[str, str],
    mode: str,
    most: int,
) -> None:
    model = ScriptedSummarizer()
    model.mode = mode
    async with own_stack(
        temporal_client, settings, sessions, model, prefix="sumfail", **SMALL
    ) as stack:
        client = ParleyClient(stack.url, tokens["priya"])
        sid = await client.new_session()
        for n in range(1, 9):
            await turn_closed(temporal_client, await turn(client, sid, n))
        await eventually(
            lambda: run_settled(temporal_client, sid), timeout=DEADLINE_S, what="the run ended"
        )
        await client.aclose()
    assert model.requests, "the summarizer was never asked"
    if mode == "plain":
        # Each pass that asked the model wrote one fallback version (its two requests' tokens
        # on it); after one, the next passes write by code without asking, until the
        # `summary_model_retry_every`-th (parley/fold.py `ask_the_model`).
        async with orm(sessions) as db:
            versions = await db.scalar(
                select(func.count())
                .select_from(ConversationSummary)
                .where(
                    ConversationSummary.session_id == sid,
                    ConversationSummary.written_by == "fallback",
                    ConversationSummary.input_tokens > 0,
                )
            )
        assert sum(model.requests.values()) == most * versions, (model.requests, versions)
    else:
        assert max(model.requests.values()) <= most, model.requests


async def test_the_tenants_usage_counts_the_summarizers_tokens(
    settings: Settings,
    temporal_client: Client,
    sessions: Database,
    tokens: dict[str, str],
) -> None:
    model = ScriptedSummarizer()
    async with own_stack(
        temporal_client, settings, sessions, model, prefix="sumusage", **SMALL
    ) as stack:
        admin = ParleyClient(stack.url, tokens["admin"])
        client = ParleyClient(stack.url, tokens["priya"])

        async def usage() -> dict[str, Any]:
            answer = await admin.http.get("/v1/admin/tenants/northwind/usage", params={"days": 1})
            assert answer.status_code == 200, answer.text
            return dict(answer.json())

        before = await usage()
        sid = await client.new_session()
        n = 0
        while not model.requests:
            n += 1
            assert n <= 12, "no summary run after 12 turns"
            await turn_closed(temporal_client, await turn(client, sid, n))
        await summary_handle(temporal_client, sid).result()
        after = await usage()
        denied = await client.http.get("/v1/admin/tenants/northwind/usage")
        await client.aclose()
        await admin.aclose()

    assert denied.status_code == 403  # a customer reads no tenant's bill
    written = sum(model.requests.values())
    delta = {
        part: {k: after[part][k] - before[part][k] for k in after[part]}
        for part in ("turns", "summaries", "total")
    }
    # Other tests of the tenant may run meanwhile: at least this session's share.
    assert delta["summaries"]["requests"] >= written >= 1
    assert delta["summaries"]["input_tokens"] >= written * SUMMARIZER_USAGE["input_tokens"]
    assert delta["summaries"]["output_tokens"] >= written * SUMMARIZER_USAGE["output_tokens"]
    assert delta["turns"]["requests"] >= n
    for kind in ("requests", "input_tokens", "output_tokens"):
        assert after["total"][kind] == after["turns"][kind] + after["summaries"][kind]
