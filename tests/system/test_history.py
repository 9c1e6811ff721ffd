"""Workflow history stays small: ids, not prompts, travel through it."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import select
from temporalio.client import Client

from parley.config import Settings
from parley.gateway.demo import DemoModel
from parley.ids import workflow_id_for_turn
from parley.store.db import Database
from parley.store.models import ModelCall
from tests.support.client import ParleyClient
from tests.support.orm import orm
from tests.support.toolkit import own_stack


async def history_size(client: Client, turn_id: str) -> int:
    """The size of the turn's whole history: `done` goes out before the turn's last step
    (starting the rolling summary), so wait for the workflow to close first."""
    handle = client.get_workflow_handle(workflow_id_for_turn(turn_id))
    await handle.result()
    description = await handle.describe()
    return int(description.raw_description.workflow_execution_info.history_size_bytes)


# Thirty whole turns on a stack of its own: about 15 s alone, several times that on a loaded
# 2-core run, so its bound is wider than the suite's.
@pytest.mark.timeout(480)
async def test_history_at_turn_30_is_within_20_percent_of_turn_1(
    settings: Settings,
    tokens: dict[str, str],
    temporal_client: Client,
    sessions: Database,
) -> None:
    # Conversation budgets roomy enough for the prompt to grow well past twice turn 1's (the
    # default budget keeps prompts flatter than that), so a transcript carried through history
    # could not hide in the comparison below.
    async with own_stack(
        temporal_client,
        settings,
        sessions,
        DemoModel(token_delay_s=0),
        prefix="history",
        context_conversation_tokens=900,
        context_summary_tokens=500,
        context_recall_tokens=500,
    ) as stack:
        priya = ParleyClient(stack.url, tokens["priya"])
        session_id = await priya.new_session()
        turn_ids = []
        for n in range(1, 31):
            # Every message is long, so a transcript passed through history would show at once.
            turn_id, events = await priya.turn(session_id, f"Message {n}: " + "tell me more. " * 40)
            assert events[-1].type == "done"
            turn_ids.append(turn_id)
        await priya.aclose()
    first, last = (
        await history_size(temporal_client, turn_ids[0]),
        await history_size(temporal_client, turn_ids[-1]),
    )
    assert first > 0
    assert abs(last - first) <= 0.2 * first, (first, last)
    # ...while the prompt behind turn 30 is many times larger than turn 1's. Its messages,
    # that is: the tool schemas are the same on every turn, so they say nothing about growth.
    async with orm(sessions) as db:
        prompts = {
            turn_id: len(json.dumps(request["messages"]))
            for turn_id, request in (
                await db.execute(
                    select(ModelCall.turn_id, ModelCall.request).where(
                        ModelCall.turn_id.in_([turn_ids[0], turn_ids[-1]])
                    )
                )
            ).all()
        }
    assert prompts[turn_ids[-1]] > 2 * prompts[turn_ids[0]]
    assert (last - first) < prompts[turn_ids[-1]] - prompts[turn_ids[0]]
