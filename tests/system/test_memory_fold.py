"""Issue 26, acceptance 1 and 2: sixty turns through a real provider's wire format (the local
OpenAI-compatible server, real PostgreSQL and Temporal), with a summarizer that answers in
plain text and with one that answers with valid JSON. The conversation budget is a ceiling
either way; the nickname from turn 1 is still in the prompt at turn 60; a summarizer that
cannot give JSON is asked once and repaired once per summary run, then the code writes the
summary (`written_by: fallback`), and one that can is used (`written_by` names the model)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import select
from temporalio.client import Client, WorkflowFailureError
from temporalio.service import RPCError

from parley.config import Settings
from parley.context import STATE_PREFIX, read_missing
from parley.gateway.base import ModelRequest
from parley.gateway.errors import Timeouts
from parley.gateway.fake_provider.server import FakeProvider
from parley.gateway.openai_compat import OpenAICompatProvider
from parley.ids import summary_workflow_id, workflow_id_for_turn
from parley.memory import is_summary_request
from parley.prompt import CONVERSATION_KINDS, FOLD_PREFIX
from parley.store.db import Database
from parley.store.models import ConversationSummary
from parley.tokens import count_messages, counter_for
from tests.support.client import ParleyClient
from tests.support.orm import orm
from tests.support.stack import serve
from tests.support.toolkit import model_calls, own_stack

# Small budgets, so that summaries are due every few turns and the 60 turns stay quick.
CONVERSATION_TOKENS = 300
BUDGETS = {
    "context_conversation_tokens": CONVERSATION_TOKENS,
    "context_summary_tokens": 80,
    "context_recall_tokens": 60,
    "summary_min_new_tokens": 60,
    "summary_start_delay_ms": 0,
}
FIRST = "Hi, my account nickname is trailblazer. Please leave parcels at the back door."
# The system messages that belong to the conversation's share (parley/prompt.py).
CONVERSATION_PREFIXES = (
    "What the user told us about themselves",
    "Summary of the conversation up to seq",
    FOLD_PREFIX,
    "Earlier in this conversation, recalled by search",
)


def statement(n: int) -> str:
    """A turn the demo logic answers without tools (short and quick)."""
    return f"Note {n}: please leave my parcels at the green door number {n}."


def plain_text(request: ModelRequest) -> str:
    del request
    return "Here is a summary: the customer talked about parcels and doors."


def valid_json(request: ModelRequest) -> str:
    """The summary a model in structured-output mode writes (its lines marked as its own)."""
    transcript = json.loads(request.messages[1]["content"])
    return json.dumps(
        {
            "lines": [
                {"seq": m["seq"], "text": f"Model line: {' '.join(m['text'].split()[:6])}"}
                for m in transcript
                if m["role"] == "user"
            ],
            "facts": [],
        }
    )


def conversation_part(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The prompt's conversation blocks: pinned facts, summary, folded gap, recalled lines
    and the earlier turns (between the instructions and the state block)."""
    state_at = next(
        i
        for i, m in enumerate(messages)
        if m["role"] == "system" and str(m["content"]).startswith(STATE_PREFIX)
    )
    return [
        m
        for m in messages[1:state_at]
        if m["role"] != "system" or str(m["content"]).startswith(CONVERSATION_PREFIXES)
    ]


async def summaries_settled(client: Client, session_id: str, turn_ids: list[str]) -> None:
    """Every turn closed, then the session's summary run (one at a time per session, under
    the session's id) closed too, whether it folded, failed or never started."""
    for turn_id in turn_ids:
        await client.get_workflow_handle(workflow_id_for_turn(turn_id)).result()
    handle = client.get_workflow_handle(summary_workflow_id(session_id=session_id))
    try:
        await handle.result()
    except RPCError:
        pass  # never started: nothing was due
    except WorkflowFailureError:
        pass  # it ran, and failed (the assertions below say what that cost)


@pytest.mark.parametrize(
    ("summarizer", "model"), [(plain_text, "gpt-plain"), (valid_json, "gpt-json")]
)
async def test_sixty_turns_keep_to_the_conversation_budget_whatever_the_summarizer_answers(
    summarizer: Callable[[ModelRequest], str],
    model: str,
    settings: Settings,
    temporal_client: Client,
    sessions: Database,
    tokens: dict[str, str],
) -> None:
    fake = FakeProvider(brain=True)
    fake.summarizer = summarizer
    async with serve(fake.app) as fake_url:
        provider = OpenAICompatProvider(
            base_url=fake_url + "/v1",
            api_key="test-key",
            timeouts=Timeouts(connect_s=2.0, first_token_s=5.0, total_s=30.0),
        )
        async with own_stack(
            temporal_client,
            settings,
            sessions,
            provider,
            prefix=f"fold-{model}",
            model_provider="openai",
            model=model,
            **BUDGETS,
        ) as stack:
            client = ParleyClient(stack.url, tokens["priya"])
            sid = await client.new_session()
            turn_ids = []
            for n, text in enumerate([FIRST, *(statement(n) for n in range(2, 61))], 1):
                turn_id, events = await client.turn(sid, text)
                assert events[-1].type == "done", (n, [(e.type, e.data) for e in events[-3:]])
                turn_ids.append(turn_id)
            await client.aclose()
            await summaries_settled(temporal_client, sid, turn_ids)
        await provider.aclose()

    counter = counter_for(model)
    firsts: dict[int, dict[str, Any]] = {}
    largest = 0
    trimmed = 0  # prompts that name something left out
    for number, turn_id in enumerate(turn_ids, start=1):
        [call] = await model_calls(sessions, turn_id)  # statements: one model call a turn
        request = call.request
        budget = request["budget"]
        # Within the conversation budget: by a fresh count of the conversation's messages, and
        # by the stored figures of the blocks the packer kept.
        recount = count_messages(counter, conversation_part(request["messages"]))
        assert recount <= CONVERSATION_TOKENS, (number, recount, budget)
        largest = max(largest, recount)
        trimmed += bool(read_missing(request["messages"]))
        kept = [v for k, v in budget["blocks"].items() if k in CONVERSATION_KINDS]
        assert sum(kept) <= CONVERSATION_TOKENS, (number, budget["blocks"])
        # No turn falls between the summary and what the prompt shows (folded or verbatim).
        shown_from = (budget.get("folded") or {}).get("from_seq") or budget["window_from_seq"]
        if shown_from is not None:
            assert (budget["summary_through_seq"] or 0) + 1 >= shown_from, (number, budget)
        firsts[number] = request
    last = firsts[60]
    text = "\n".join(str(m["content"]) for m in last["messages"])
    assert "account nickname: trailblazer (said at seq 1)" in text
    ten, sixty = firsts[10]["budget"]["prompt_tokens"], last["budget"]["prompt_tokens"]
    assert sixty <= 1.25 * ten, (ten, sixty)

    async with orm(sessions) as db:
        rows = list(
            await db.scalars(
                select(ConversationSummary).where(ConversationSummary.session_id == sid)
            )
        )
    asked = [r for r in fake.requests if is_summary_request(_canonical(r.body))]
    assert rows
    # Each pass of the session's summary run writes one version: asked once for it, plus one
    # repair where the first answer was unusable.
    if summarizer is plain_text:
        assert {r.written_by for r in rows} == {"fallback"}
        # After a version the model could not write, the next runs fold by code without
        # asking it, until every `summary_model_retry_every`-th run; each run that asks sends
        # the question and its one repair, both on the version's tokens.
        every = settings.summary_model_retry_every
        ordered = sorted(rows, key=lambda r: r.through_seq)
        assert [r.input_tokens > 0 for r in ordered] == [
            i % every == 0 for i in range(len(ordered))
        ]
        assert len(asked) == 2 * sum(r.input_tokens > 0 for r in ordered)
        assert "The user said" in text  # the code summary's lines reach the prompt
    else:
        assert {r.written_by for r in rows} == {model}
        assert len(asked) == len(rows)  # valid at once: no repair
        assert "Model line:" in text
    assert all(r.body.get("response_format", {}).get("type") == "json_schema" for r in asked)
    print(  # the figures, for the record (pytest -s)
        f"{model}: conversation tokens at most {largest} of {CONVERSATION_TOKENS}; prompt "
        f"turn 10 {ten}, turn 60 {sixty} ({sixty / ten:.2f}x); summarizer requests "
        f"{len(asked)}, versions {len(rows)} written by "
        f"{sorted({r.written_by for r in rows})}; prompts naming a drop {trimmed}"
    )


def _canonical(body: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"role": m["role"], "content": m.get("content")} for m in body["messages"]]
