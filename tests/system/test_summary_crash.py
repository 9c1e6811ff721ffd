"""A summary run killed midway through the whole stack loses nothing: the stored summary
stays where it was, and the summary a later turn starts covers the gap from the last stored
`through_seq`, every message once (issue 10, acceptance 6)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from functools import partial

from sqlalchemy import select
from temporalio import activity
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError

from parley.config import Settings
from parley.gateway.base import ModelRequest, StreamEvent
from parley.gateway.demo import DemoModel
from parley.ids import summary_workflow_id, workflow_id_for_turn
from parley.memory import is_summary_request
from parley.prompt import StoredSummary
from parley.store import memory as memory_store
from parley.store.db import Database
from parley.store.models import Message
from tests.support.client import ParleyClient
from tests.support.orm import orm
from tests.support.toolkit import eventually, own_stack


class HeldSummarizer:
    """The demo model, except that while `held` a summary request stops midway (after the
    summarizer was asked, before it answered) until the test kills it."""

    name = "demo"

    def __init__(self) -> None:
        self.demo = DemoModel(token_delay_s=0)
        self.held = False
        self.workflow_id: str | None = None  # the summary run caught midway
        self.killed = asyncio.Event()

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
        if self.held and is_summary_request(request.messages):
            self.workflow_id = activity.info().workflow_id
            await self.killed.wait()
            raise RuntimeError("worker killed while summarizing")
        async for event in self.demo.stream(request):
            yield event


# Statements the demo answers without tools: one user and one assistant message a turn.
def statement(n: int) -> str:
    return f"Note {n}: please leave my parcels at the green door number {n}."


async def test_a_summary_run_killed_midway_is_covered_by_the_next_one(
    settings: Settings,
    temporal_client: Client,
    sessions: Database,
    tokens: dict[str, str],
) -> None:
    model = HeldSummarizer()
    async with own_stack(
        temporal_client,
        settings,
        sessions,
        model,
        prefix="sumcrash",
        # Runs for folding alone (with recall by meaning the first turn's run would embed).
        embeddings="",
        summary_start_delay_ms=0,
        summary_min_new_tokens=1,
        context_conversation_tokens=300,
        context_summary_tokens=4000,  # the cap holds every folded line
    ) as stack:
        client = ParleyClient(stack.url, tokens["priya"])
        sid = await client.new_session()

        async def latest() -> StoredSummary | None:
            async with sessions() as db:
                return await memory_store.latest_summary(db, session_id=sid)

        async def turn(n: int) -> str:
            turn_id, events = await client.turn(sid, statement(n))
            assert events[-1].type == "done", events[-1]
            return turn_id

        n = 0
        while await latest() is None:  # turns until a summary is stored
            n += 1
            assert n <= 12, "no summary after 12 turns"
            finished = await turn(n)
            # That turn's summary run has ended, or the turn started none (nothing to fold).
            started = await eventually(
                partial(_summary_settled, temporal_client, finished, sid),
                timeout=20,
                what="the turn's summary run closed",
            )
            if n == 1:  # one short exchange is all in the recent window
                assert started == "none", started
        stored = await latest()
        assert stored is not None
        base = stored.through_seq

        # The next turns' summary runs are caught in the summarizer; the first is killed there.
        model.held = True
        n += 1
        await turn(n)
        await eventually(lambda: _caught(model), timeout=20, what="a summary run in the model")
        assert model.workflow_id is not None
        await temporal_client.get_workflow_handle(model.workflow_id).terminate("killed midway")
        model.killed.set()
        after_kill = await latest()
        assert after_kill is not None and after_kill.through_seq == base  # nothing half-written

        # More of the conversation, summaries working again: the next run covers the gap.
        model.held = False
        await turn(n + 1)
        covered = await eventually(
            lambda: _summary_past(latest, base + 1), timeout=30, what="a summary past the gap"
        )
        await client.aclose()

    # Every message through the new end has its line, once, the killed run's share included.
    seqs = [line.seq for line in covered.lines]
    assert seqs == list(range(1, covered.through_seq + 1))
    async with orm(sessions) as db:
        texts = dict(
            (
                await db.execute(
                    select(Message.seq, Message.text).where(
                        Message.session_id == sid, Message.seq <= covered.through_seq
                    )
                )
            ).all()
        )
    for line in covered.lines:
        if line.seq > base and texts[line.seq].startswith("Note "):
            # What the user said in the gap is in the summary, in their words.
            assert texts[line.seq].split(":")[0] in line.text, line


async def _caught(model: HeldSummarizer) -> bool:
    return model.workflow_id is not None


async def _summary_past(latest, seq: int):  # type: ignore[no-untyped-def]
    found = await latest()
    return found if found is not None and found.through_seq >= seq else None


async def _summary_settled(client: Client, turn_id: str, session_id: str) -> str | None:
    """ "none" when the turn ended and its session has no summary run, "closed" when the
    session's run (which the turn started or signalled) has ended, None while either is
    still running."""
    turn = await client.get_workflow_handle(workflow_id_for_turn(turn_id)).describe()
    if turn.status == WorkflowExecutionStatus.RUNNING:
        return None  # its last step, which starts the run, may be under way
    handle = client.get_workflow_handle(summary_workflow_id(session_id=session_id))
    try:
        described = await handle.describe()
    except RPCError:
        return "none"
    return "closed" if described.status != WorkflowExecutionStatus.RUNNING else None
