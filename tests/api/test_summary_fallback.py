"""The rolling summary with a summarizer that answers badly: one repair attempt, then the code
summarizer (parley/fold.py), recorded on the row (`written_by`) and in a metric; never a
failure Temporal would retry with the same prompt. And the fold itself, as pure code: what
it keeps, and the conversation budget it keeps to."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from sqlalchemy import select

from parley.activities.memory import MemoryActivities
from parley.activities.metrics import SUMMARIES
from parley.config import Settings
from parley.context import MISSING_PREFIX, Block, Position, Share, WindowMessage, pack
from parley.contracts import SummarizeInput
from parley.fold import ask_the_model, fold, within
from parley.gateway.anthropic import AnthropicProvider
from parley.gateway.base import Finish, ModelRequest, StreamEvent, TextDelta
from parley.gateway.errors import ProviderFatal, Timeouts
from parley.gateway.fake_provider.server import FakeProvider
from parley.gateway.openai_compat import OpenAICompatProvider
from parley.gateway.registry import ProviderPool
from parley.memory import SUMMARY_SCHEMA, SUMMARY_SCHEMA_NAME, SummaryLine
from parley.prompt import Memory, StoredSummary, fold_block
from parley.store import memory as memory_store
from parley.store import summaries
from parley.store.db import Database
from parley.store.models import ChatSession, ConversationSummary, Message
from parley.tokens import default_counter
from parley.window import choose_window, group_turns
from tests.support.client import ParleyClient
from tests.support.orm import orm
from tests.support.stack import serve
from tests.support.toolkit import store_history

TOOL_RESULT = json.dumps({"name": "get_order", "result": {"order_id": "8472", "status": "shipped"}})
HISTORY: list[tuple[str, str]] = [
    ("user", "Hi, my account nickname is trailblazer. Where is order 8472?"),
    ("tool", TOOL_RESULT),
    ("assistant", "Order 8472 has shipped and should arrive on Oct 30."),
    ("user", "I decided to keep it. Please cancel the return I asked about."),
    ("assistant", "Understood: no return for order 8472."),
]
for n in range(1, 9):
    HISTORY += [
        ("user", f"Question number {n} about the delivery of order 8472, with a few words."),
        ("assistant", f"Answer number {n}: it is on its way, nothing has changed since."),
    ]


class Scripted:
    """A summarizer that answers each request with the next scripted text (or raises it)."""

    name = "scripted"

    def __init__(self, *answers: str | Exception) -> None:
        self.answers = list(answers)
        self.requests: list[ModelRequest] = []

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
        self.requests.append(request)
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        yield TextDelta(answer)
        yield Finish("stop", {"input_tokens": 100, "output_tokens": 20})


async def seeded_session(sessions: Database, client: ParleyClient) -> str:
    sid = await client.new_session()
    await store_history(sessions, sid, HISTORY)
    return sid


def memory_with(settings: Settings, sessions: Database, model: Any):
    tight = settings.model_copy(
        update={
            "context_conversation_tokens": 300,
            "context_summary_tokens": 500,
            "summary_min_new_tokens": 1,
            "model_provider": "scripted",
            "model": "scripted-model",
        }
    )
    return MemoryActivities(
        sessions=sessions, providers=ProviderPool(tight, primary=model), settings=tight
    )


async def stored(sessions: Database, sid: str) -> ConversationSummary:
    async with orm(sessions) as db:
        return (
            await db.scalars(
                select(ConversationSummary).where(ConversationSummary.session_id == sid)
            )
        ).one()


def counted(outcome: str) -> float:
    return SUMMARIES.labels("scripted", "scripted-model", outcome)._value.get()


def valid_answer(transcript_text: str) -> str:
    del transcript_text
    return json.dumps(
        {
            "lines": [{"seq": 1, "text": "Model line: the user asked where order 8472 is."}],
            "facts": [{"key": "account_nickname", "value": "trailblazer", "seq": 1}],
        }
    )


async def test_an_invalid_answer_is_repaired_once_and_the_models_summary_is_used(
    settings: Settings, sessions: Database, priya: ParleyClient
) -> None:
    sid = await seeded_session(sessions, priya)
    model = Scripted("Sure! The user asked about order 8472.", valid_answer(""))
    before = counted("repaired")
    result = await memory_with(settings, sessions, model).summarize(SummarizeInput(sid, "trn_x"))
    assert result.summarized
    row = await stored(sessions, sid)
    assert row.written_by == "scripted-model"
    assert [line["text"] for line in row.lines] == [
        "Model line: the user asked where order 8472 is."
    ]
    assert row.input_tokens == 200  # both attempts' tokens are what the summary cost
    assert counted("repaired") == before + 1
    # Two requests, both in structured-output mode; the repair shows the bad answer and why.
    first, repair = model.requests
    assert first.output_schema is not None and first.output_schema.schema == SUMMARY_SCHEMA
    assert repair.messages[:2] == first.messages
    assert repair.messages[2] == {
        "role": "assistant",
        "content": "Sure! The user asked about order 8472.",
    }
    assert "did not answer with JSON" in repair.messages[3]["content"]


async def test_an_answer_the_schema_refuses_is_sent_back_with_the_validation_error(
    settings: Settings, sessions: Database, priya: ParleyClient
) -> None:
    sid = await seeded_session(sessions, priya)
    model = Scripted('{"lines": [{"seq": "one", "text": "x"}]}', valid_answer(""))
    await memory_with(settings, sessions, model).summarize(SummarizeInput(sid, "trn_x"))
    assert (await stored(sessions, sid)).written_by == "scripted-model"
    error = model.requests[1].messages[-1]["content"]
    assert "'facts' is a required property" in error or "is not of type" in error


async def test_two_bad_answers_fall_back_to_the_code_summary_which_keeps_what_the_user_said(
    settings: Settings, sessions: Database, priya: ParleyClient
) -> None:
    sid = await seeded_session(sessions, priya)
    model = Scripted("Here is a summary of the chat.", "```\nStill not JSON\n```")
    before = counted("fallback")
    result = await memory_with(settings, sessions, model).summarize(SummarizeInput(sid, "trn_x"))
    assert result.summarized and len(model.requests) == 2  # once, plus one repair
    row = await stored(sessions, sid)
    assert row.written_by == "fallback" and row.model == "scripted-model"
    assert counted("fallback") == before + 1
    texts = [line["text"] for line in row.lines]
    # The user's statements and decision, and the tool's finding, survive in the fallback.
    assert 'The user said: "Hi, my account nickname is trailblazer."' in texts
    assert 'The user said: "I decided to keep it."' in texts
    assert "Tool get_order answered for order 8472: status shipped." in texts
    assert [line["seq"] for line in row.lines] == list(range(1, row.through_seq + 1))
    async with sessions() as db:
        _, pinned = await memory_store.summary_and_facts(db, session_id=sid)
    assert [(f.key, f.value) for f in pinned] == [("account_nickname", "trailblazer")]


def test_after_a_fallback_the_model_is_asked_again_only_every_nth_run() -> None:
    asked = [ask_the_model(fallbacks, every=8) for fallbacks in range(18)]
    assert [n for n, yes in enumerate(asked) if yes] == [0, 8, 16]
    assert all(ask_the_model(n, every=1) for n in range(5))


async def append(sessions: Database, sid: str, count: int) -> None:
    """`count` more exchanges after what the session holds."""
    async with orm(sessions) as db:
        session = await db.get(ChatSession, sid)
        assert session is not None
        seq = session.last_seq
        for n in range(count):
            for role, text in HISTORY[5:7]:
                seq += 1
                db.add(
                    Message(
                        id=f"msg_{uuid.uuid4().hex[:20]}",
                        session_id=sid,
                        seq=seq,
                        role=role,
                        status="complete",
                        text=f"Later {n}: {text}",
                    )
                )
        session.last_seq = seq
        await db.commit()


async def test_a_model_that_failed_the_last_version_is_not_asked_for_the_next(
    settings: Settings, sessions: Database, priya: ParleyClient
) -> None:
    sid = await seeded_session(sessions, priya)
    model = Scripted("Here is a summary of the chat.", "Still prose.")  # nothing more
    memory = memory_with(settings, sessions, model)
    assert (await memory.summarize(SummarizeInput(sid, "trn_1"))).summarized
    await append(sessions, sid, 8)
    assert (await memory.summarize(SummarizeInput(sid, "trn_2"))).summarized
    assert len(model.requests) == 2  # the first run's question and repair; none since
    async with orm(sessions) as db:
        rows = list(
            await db.scalars(
                select(ConversationSummary)
                .where(ConversationSummary.session_id == sid)
                .order_by(ConversationSummary.through_seq)
            )
        )
    async with sessions() as db:
        assert await summaries.fallbacks_in_a_row(db, session_id=sid) == 2
    assert [(r.written_by, r.input_tokens) for r in rows] == [("fallback", 200), ("fallback", 0)]
    # The code folded the later turns in all the same.
    assert rows[1].through_seq > rows[0].through_seq
    assert any("Later " in line["text"] for line in rows[1].lines)


async def test_a_provider_that_refuses_the_request_falls_back_without_a_retry(
    settings: Settings, sessions: Database, priya: ParleyClient
) -> None:
    sid = await seeded_session(sessions, priya)
    refusal = ProviderFatal("no json_schema here", provider="scripted", code="bad_request")
    model = Scripted(refusal)
    result = await memory_with(settings, sessions, model).summarize(SummarizeInput(sid, "trn_x"))
    assert result.summarized and len(model.requests) == 1
    assert (await stored(sessions, sid)).written_by == "fallback"


# --- the providers' structured-output modes, on the wire ----------------------------------------


@pytest.mark.parametrize("dialect", ["openai", "anthropic"])
async def test_the_summarizer_asks_in_each_providers_structured_output_mode(
    dialect: str,
    settings: Settings,
    sessions: Database,
    priya: ParleyClient,
) -> None:
    fake = FakeProvider(brain=True)  # answers the summary like the demo model (valid JSON)
    async with serve(fake.app) as url:
        timeouts = Timeouts(connect_s=2.0, first_token_s=5.0, total_s=20.0)
        provider: Any = (
            OpenAICompatProvider(base_url=url + "/v1", api_key="k", timeouts=timeouts)
            if dialect == "openai"
            else AnthropicProvider(base_url=url, api_key="k", timeouts=timeouts)
        )
        provider.name = "scripted"
        sid = await seeded_session(sessions, priya)
        await memory_with(settings, sessions, provider).summarize(SummarizeInput(sid, "trn_x"))
        await provider.aclose()
    [seen] = fake.requests
    if dialect == "openai":
        assert seen.body["response_format"] == {
            "type": "json_schema",
            "json_schema": {
                "name": SUMMARY_SCHEMA_NAME,
                "schema": SUMMARY_SCHEMA,
                "strict": True,
                "description": seen.body["response_format"]["json_schema"]["description"],
            },
        }
    else:
        assert seen.body["tool_choice"] == {"type": "tool", "name": SUMMARY_SCHEMA_NAME}
        [tool] = seen.body["tools"]
        assert tool["name"] == SUMMARY_SCHEMA_NAME and tool["input_schema"] == SUMMARY_SCHEMA
    # Anthropic answers with the forced tool's input; either way the model's lines are used.
    assert (await stored(sessions, sid)).written_by == "scripted-model"


# --- the fold, as pure code --------------------------------------------------------------------


def test_the_fold_keeps_user_statements_and_tool_findings_before_the_assistants_words() -> None:
    transcript = [
        {"seq": seq, "role": role, "text": text} for seq, (role, text) in enumerate(HISTORY, 1)
    ]
    lines, facts = fold(transcript)
    assert [(f.key, f.value, f.seq) for f in facts] == [("account_nickname", "trailblazer", 1)]
    counter = default_counter()
    kept, left = within(lines, max_tokens=120, count=counter.count)
    kept_texts = [line.text for line in kept]
    assert 'The user said: "I decided to keep it."' in kept_texts
    assert not any(t.startswith("The assistant answered") for t in kept_texts)
    assert left and all(line not in kept for line in left)


def test_a_lagging_summarys_gap_is_folded_within_its_share_and_the_rest_is_named() -> None:
    counter = default_counter()
    messages = [
        WindowMessage(seq, role, text, "complete", tokens=counter.count(text))
        for seq, (role, text) in enumerate(HISTORY, 1)
        if role != "tool"
    ]
    window = choose_window(group_turns(messages), recent_tokens=60, summary_through=None)
    assert window.gap and window.from_seq == 20
    memory = Memory(summary=StoredSummary(0, [], "m"))
    folded = fold_block(counter, window, memory, max_tokens=150)
    assert folded.blocks[0].tokens <= 150
    text = folded.blocks[0].messages[0]["content"]
    # What the user said, newest first, without the assistant's words; the older lines are
    # named, not lost silently.
    assert "18 user: Question number 7" in text and "Answer number" not in text
    assert "Question number 8" not in text  # seq 20 is in the window
    [left_out] = folded.left_out
    assert left_out == "5 condensed lines of the turns at seq 1 to 10"
    roomy = fold_block(counter, window, memory, max_tokens=400)
    assert not roomy.left_out
    assert "4 user: I decided to keep it." in roomy.blocks[0].messages[0]["content"]
    assert (folded.from_seq, folded.through_seq) == (1, 19)


def test_the_conversation_share_is_a_ceiling_and_what_it_leaves_out_is_named() -> None:
    def block(kind: str, tokens: int, priority: int, position: int = Position.history) -> Block:
        message = {"role": "system", "content": kind}
        return Block(kind, f"the {kind}", (message,), tokens, position, priority=priority)

    blocks = [
        Block("current", "c", ({"role": "user", "content": "now"},), 5, Position.current, 0, True),
        block("summary", 100, 70, Position.summary),
        block("history", 150, 49),
        block("recall", 100, 40, Position.recall),
    ]
    packed = pack(
        blocks,
        budget=10_000,
        count_note=lambda note: 10,
        share=Share(frozenset({"summary", "history", "recall"}), 300),
        left_out=["3 condensed lines of the turns at seq 4 to 9"],
    )
    assert sum(b.tokens for b in packed.kept if b.kind != "current") == 250
    assert packed.missing == ["3 condensed lines of the turns at seq 4 to 9", "the recall"]
    note = next(m["content"] for m in packed.messages if m["content"].startswith(MISSING_PREFIX))
    assert "seq 4 to 9" in note and "the recall" in note


def test_summary_lines_stay_typed() -> None:
    assert SummaryLine(1, "x").as_json() == {"seq": 1, "text": "x", "refs": {}}
