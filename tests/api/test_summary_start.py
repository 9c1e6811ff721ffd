"""A turn starts the rolling summary only when the summary has work: enough of the conversation
has left the recent window. The turn's check reads the messages' stored token counts instead
of the messages; it must decide exactly as the summary run does, whatever the conversation
holds (tool calls, a retracted answer, a message stored without its count)."""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import update
from temporalio.testing import ActivityEnvironment

from parley.activities.memory import MemoryActivities
from parley.config import Settings
from parley.contracts import SummarizeInput, TurnState
from parley.gateway.demo import DemoModel
from parley.gateway.registry import ProviderPool
from parley.statuses import DeclineReason
from parley.store import summaries
from parley.store.db import Database, connect
from parley.store.events import state_event
from parley.store.models import ChatSession, Message
from parley.store.turns.endings import close_out_announced
from tests.support.client import ParleyClient
from tests.support.orm import orm


class RecordedStarts:
    """A Temporal client that records the workflows it is asked to start."""

    def __init__(self) -> None:
        self.started: list[str] = []

    async def start_workflow(self, _workflow: str, _arg: Any, *, id: str, **_: Any) -> None:
        self.started.append(id)


def exchange(n: int) -> list[dict[str, Any]]:
    """One turn of the conversation; every third looks something up, every fifth answer was
    withdrawn by the output screen."""
    rows: list[dict[str, Any]] = [{"role": "user", "text": f"Question {n} about order 84{n}."}]
    if n % 3 == 0:
        call = {"id": f"call_{n}", "name": "get_order", "arguments": {"order_id": f"84{n}"}}
        rows += [
            {"role": "assistant", "text": "", "tool_calls": [call]},
            {"role": "tool", "text": '{"status": "shipped"}', "tool_call_id": f"call_{n}"},
        ]
    status = "retracted" if n % 5 == 0 else "complete"
    text = f"Answer {n}: order 84{n} left the warehouse and should arrive within a few days."
    return [*rows, {"role": "assistant", "text": text, "status": status}]


async def seed(
    sessions: Database,
    session_id: str,
    rows: list[dict[str, Any]],
    after: int = 0,
) -> None:
    async with orm(sessions) as db:
        for seq, row in enumerate(rows, start=after + 1):
            fields = {"status": "complete", **row}
            db.add(
                Message(id=f"msg_{uuid.uuid4().hex[:20]}", session_id=session_id, seq=seq, **fields)
            )
        await db.execute(
            update(ChatSession)
            .where(ChatSession.id == session_id)
            .values(last_seq=after + len(rows))
        )
        await db.commit()


async def starts_summary(memory: MemoryActivities, client: RecordedStarts, session_id: str) -> bool:
    before = len(client.started)
    await ActivityEnvironment().run(memory.start_summary, SummarizeInput(session_id, "trn_seed"))
    return len(client.started) > before


async def without_token_count(sessions: Database, session_id: str, *, seq: int) -> None:
    """The message at `seq` as one stored before messages carried their token count."""
    async with orm(sessions) as db:
        await db.execute(
            update(Message)
            .where(Message.session_id == session_id, Message.seq == seq)
            .values(token_count=None)
            .execution_options(synchronize_session=False)
        )
        await db.commit()


async def test_the_summary_starts_exactly_when_its_run_has_something_to_fold(
    settings: Settings, sessions: Database, priya: ParleyClient
) -> None:
    small = settings.model_copy(update={"context_conversation_tokens": 400})
    client = RecordedStarts()
    memory = MemoryActivities(
        sessions=sessions,
        providers=ProviderPool(small, primary=DemoModel(token_delay_s=0)),
        settings=small,
        client=client,  # type: ignore[arg-type]
    )
    decisions = []
    for turns in range(1, 13):
        session_id = await priya.new_session()
        rows = [row for n in range(1, turns + 1) for row in exchange(n)]
        await seed(sessions, session_id, rows)
        if turns == 11:  # a message stored before messages carried their token count
            await without_token_count(sessions, session_id, seq=2)
        started = await starts_summary(memory, client, session_id)
        result = await memory.summarize(SummarizeInput(session_id, "trn_seed"))
        assert started == result.summarized, f"{turns} turns"
        decisions.append(started)
        if started:  # folded now: the next turn has nothing new to fold
            assert not await starts_summary(memory, client, session_id)
    assert decisions[0] is False and decisions[-1] is True


async def test_a_turns_ending_reads_the_backlog_the_check_would_read(
    sessions: Database, priya: ParleyClient
) -> None:
    """The tail step hands the summary's check the backlog its ending's last statement read
    (store/turns/endings.py `close_out_announced`); it must be the backlog the check reads alone,
    tool calls, a withdrawn answer and a message without its count included."""
    session_id = await priya.new_session()
    turn_id, events = await priya.turn(session_id, "Hello there.")
    answer = events[-1].data["message"]
    await seed(sessions, session_id, [row for n in range(1, 7) for row in exchange(n)], after=2)
    await without_token_count(sessions, session_id, seq=4)
    async with connect(sessions) as conn:
        alone = await summaries.summary_backlog(conn, session_id=session_id)
    async with sessions() as db:
        # The ending's statement again, in a transaction that is rolled back.
        with_ending = await close_out_announced(
            db,
            session_id=session_id,
            turn_id=turn_id,
            reason=DeclineReason.turn_ended,
            events=[state_event(TurnState.completed)],
            moving_to=TurnState.completed,
            answer=answer["id"],
            backlog=True,
        )
        await db.rollback()
    assert alone is not None and len(alone.messages) == 2 + 6 * 2 + 2 * 2  # two with a tool
    assert [m[0] for m in alone.messages] == list(range(1, len(alone.messages) + 1))
    assert alone.messages[3][3] is None and any(m[2] == "retracted" for m in alone.messages)
    assert with_ending == alone
