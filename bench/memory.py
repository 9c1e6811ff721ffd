"""Memory figures for `make bench`: token cost of long conversations, time to `done` with and
without summaries, and evidence recall on LoCoMo.

(c) Scripted 20- and 50-turn conversations through the API: total input tokens against
    resending the whole history (the naive prompt: the same instructions and tool schemas
    (those the call was offered: the naive side gets the same tool rule), state and current
    message, plus every earlier message in full), the largest prompt, cached tokens (the demo
    model reports the prefix shared with the previous request under the same cache key) and
    what the summarizer cost: its input tokens count in Parley's input (and so in the ratio),
    and its input and output are shown apart.
(d) Time from POST to `done`, summaries on and off interleaved, with a reading pause
    (bench/done.py).
(e) LoCoMo (bench/data/locomo3.json): a conversation is stored as one session (speaker A as
    the user, B as the assistant) and folded into summaries; each category 1-4 question is then
    packed by the real context builder as the next user message (rolled back afterwards), and
    counted as recalled when every evidence turn is in the prompt verbatim (recent window or
    the recall block the packer kept; a candidate the recall budget had no room for does not
    count; a recalled line leaves out greetings and thank-you sentences, and a long one is cut
    at about 120 tokens, as in production). Footprint: the prompt less standing instructions
    and tool schemas, over the whole conversation's tokens. Run twice: full-text recall
    alone, and hybrid (full-text fused with the local MiniLM embeddings, when the `embeddings`
    extra is installed). Each row also counts the missed questions by LoCoMo category (1
    multi-hop, 2 temporal, 3 open-domain, 4 single-hop). bench/locomo_lab.py replays the
    ranking offline, in seconds, for trying ranking ideas.
"""

from __future__ import annotations

import json
import statistics
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import fields
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import select, update

from bench.done import render_done, time_to_done
from bench.prompt_figures import Call, render_tokens, token_row
from bench.sections import failed, guarded
from parley.activities.context import ContextBuilder
from parley.activities.memory import MemoryActivities
from parley.activities.tool_offer import tenant_tools
from parley.config import Settings
from parley.contracts import SummarizeInput
from parley.gateway.demo import DemoModel
from parley.gateway.minilm import Embedder, build_embedder
from parley.gateway.registry import ProviderPool
from parley.paths import choose_path
from parley.prompt import RECALLED_SEQ
from parley.store import slots
from parley.store.db import Database
from parley.store.messages import token_count
from parley.store.models import ChatSession, ConversationSummary, Message, ModelCall, Turn
from parley.store.turns.reads import TurnFacts
from parley.tenancy import TenantConfig
from parley.tokens import MESSAGE_OVERHEAD, counter_for
from parley.worker import build_northwind
from tests.support.client import ParleyClient
from tests.support.orm import orm

DATA = Path(__file__).resolve().parent / "data" / "locomo3.json"
# A support chat as customers write one: full sentences with some context, questions that
# need the order system (the bench runs the demo backend), references back to earlier
# orders, and small talk. Cycled for longer conversations.
SCRIPT = [
    "Hi, call me Pri. I ordered a rain shell and some socks a couple of weeks ago and they "
    "still haven't turned up. Can you tell me where my order is?",
    "Okay, thanks. I was also told that part of that order was out of stock and that I would "
    "get money back for it. What's happening with the refund?",
    "Good to know. I had an earlier order too, order 8390, with trail runners and wool socks, "
    "and one shoe's sole was peeling when I opened the box. When did that one arrive?",
    "Can I still return the socks from that order? They're a size too small and I'd rather "
    "send them back than keep them in the drawer.",
    "And is there a refund on 8390 for the peeling shoe? I sent photos of it to your team "
    "last week and haven't heard back.",
    "Thanks so much, that's really helpful. I think that covers most of it for now.",
    "Sorry, one more thing: what's the latest on order 8472? Has it shipped yet, and when "
    "should it get here?",
]


# --- (c) tokens over scripted conversations ----------------------------------------------------


async def token_table(
    client: ParleyClient,
    db_sessions: Database,
    turns: int,
    settle: Callable[[str, list[str]], Awaitable[None]] | None = None,
) -> dict[str, Any]:
    """One row: `turns` scripted turns in a new session, counted from the stored calls and
    summaries (after `settle(session_id, turn_ids)`, when given: the summary runs the
    conversation started have finished, so all they cost is counted)."""
    sid = await client.new_session()
    turn_ids = []
    for i in range(turns):
        turn_id, events = await client.turn(sid, SCRIPT[i % len(SCRIPT)])
        if events[-1].type != "done":
            raise RuntimeError(f"turn {i + 1} ended {events[-1].type}")
        turn_ids.append(turn_id)
    if settle is not None:
        await settle(sid, turn_ids)
    async with orm(db_sessions) as db:
        calls = list(
            await db.execute(
                select(ModelCall, Turn.user_seq)
                .join(Turn, Turn.id == ModelCall.turn_id)
                .where(Turn.session_id == sid, ModelCall.provider != "resolver")
            )
        )
        messages = list(
            await db.execute(
                select(Message.seq, Message.token_count).where(Message.session_id == sid)
            )
        )
        summaries = list(
            await db.scalars(
                select(ConversationSummary).where(ConversationSummary.session_id == sid)
            )
        )
    sizes = {seq: (tokens or 0) + MESSAGE_OVERHEAD for seq, tokens in messages}
    row = token_row(
        [Call(call.request["budget"], call.usage or {}, user_seq) for call, user_seq in calls],
        sizes,
        turns=turns,
        summaries=len(summaries),
        summarizer_in=sum(s.input_tokens for s in summaries),
        summarizer_out=sum(s.output_tokens for s in summaries),
    )
    return {**row, "written_by": sorted({s.written_by for s in summaries})}


# --- (e) LoCoMo evidence recall ----------------------------------------------------------------


def _when(text: str | None) -> datetime:
    try:
        return datetime.strptime(text or "", "%I:%M %p on %d %B, %Y").replace(tzinfo=UTC)
    except ValueError:
        return datetime.now(UTC)


def photo_note(turn: dict[str, Any]) -> str:
    """A shared photo's description, stored with the message as a chat product stores an
    attachment's description: LoCoMo's `blip_caption` (what an image captioner wrote; the
    search `query` the dataset's authors used to find the photo is not used). Counted in the
    conversation's tokens like the rest of the message."""
    caption = str(turn.get("blip_caption") or "").strip()
    return f" [photo: {caption}]" if caption else ""


async def ingest(
    db_sessions: Database, conversation: dict[str, Any]
) -> tuple[str, dict[str, int], int]:
    """Store the conversation as one session; returns its id, dia_id -> seq, total tokens."""
    sid = f"ses_locomo{uuid.uuid4().hex[:12]}"
    seqs: dict[str, int] = {}
    async with orm(db_sessions) as db:
        db.add(ChatSession(id=sid, tenant_id="northwind", user_id="cust_2291"))
        await db.flush()
        seq = 0
        for session in conversation["sessions"]:
            moment = _when(session["date_time"])
            for turn in session["turns"]:
                seq += 1
                role = "user" if turn["speaker"] == conversation["speaker_a"] else "assistant"
                text = f"{turn['speaker']}: {turn['text']}{photo_note(turn)}"
                db.add(
                    Message(
                        id=f"msg_l{uuid.uuid4().hex[:20]}",
                        session_id=sid,
                        seq=seq,
                        role=role,
                        status="complete",
                        text=text,
                        created_at=moment,
                    )
                )
                seqs[turn["dia_id"]] = seq
        await db.execute(update(ChatSession).where(ChatSession.id == sid).values(last_seq=seq))
        await db.commit()
        total = sum(
            (t or 0) + MESSAGE_OVERHEAD
            for t in await db.scalars(select(Message.token_count).where(Message.session_id == sid))
        )
    return sid, seqs, total


@asynccontextmanager
async def bench_builder(
    settings: Settings, db_sessions: Database, embedder: Embedder | None
) -> AsyncIterator[ContextBuilder]:
    """The real context builder with the bench's settings, its order lookups on their own
    HTTP client (closed on exit)."""
    async with httpx.AsyncClient() as http:
        yield ContextBuilder(
            sessions=db_sessions,
            settings=settings,
            northwind=build_northwind(settings, http),
            embedder=embedder,
        )


async def prepared(
    settings: Settings,
    db_sessions: Database,
    sid: str,
    total: int,
    share: float,
    embedder: Embedder | None,
) -> Settings:
    """The bench's budgets for a conversation of `total` tokens, with its backlog embedded
    and folded into summaries (as a turn's summary runs would have done)."""
    conversation_budget = int(total * share)
    tuned = settings.model_copy(
        update={
            "context_conversation_tokens": conversation_budget,
            "context_recall_tokens": int(conversation_budget * 0.75),
            "context_summary_tokens": int(conversation_budget * 0.1),
            "summary_min_new_tokens": 1,
        }
    )
    memory = MemoryActivities(
        sessions=db_sessions,
        settings=tuned,
        providers=ProviderPool(tuned, primary=DemoModel(token_delay_s=0)),
        embedder=embedder,
    )
    while await memory.embed_messages(sid):  # index the backlog (a turn's summary run does it)
        pass
    for _ in range(100):  # fold the backlog in as many runs as it takes
        if not (await memory.summarize(SummarizeInput(sid, "trn_locomo"))).summarized:
            break
    return tuned


async def locomo_one(
    settings: Settings,
    db_sessions: Database,
    name: str,
    conversation: dict[str, Any],
    share: float,
    embedder: Embedder | None = None,
) -> dict[str, Any]:
    sid, seqs, total = await ingest(db_sessions, conversation)
    tuned = await prepared(settings, db_sessions, sid, total, share, embedder)
    async with bench_builder(tuned, db_sessions, embedder) as builder:
        found = asked = 0
        missed: dict[int, int] = {}  # category -> questions with evidence left out
        footprints: list[int] = []
        for qa in conversation["qa"]:
            if qa["category"] not in (1, 2, 3, 4) or not qa["evidence"]:
                continue
            wanted = {seqs.get(e) for e in qa["evidence"]}
            if None in wanted:
                continue
            asked += 1
            shown, footprint = await _pack_question(builder, db_sessions, sid, qa["question"])
            found += wanted <= shown
            if not wanted <= shown:
                missed[qa["category"]] = missed.get(qa["category"], 0) + 1
            footprints.append(footprint)
    return {
        "conversation": name,
        "recall": "hybrid" if embedder is not None else "full-text",
        "messages": len(seqs),
        "conversation_tokens": total,
        "questions": asked,
        "evidence_recall": found / asked if asked else float("nan"),
        "missed_by_category": dict(sorted(missed.items())),
        "mean_context_tokens": statistics.fmean(footprints) if footprints else 0,
        "footprint": statistics.fmean(footprints) / total if footprints else float("nan"),
    }


async def _pack_question(
    builder: ContextBuilder,
    db_sessions: Database,
    sid: str,
    question: str,
) -> tuple[set[int], int]:
    """Pack the question as the next user message with the real builder, then roll back."""
    async with db_sessions() as db:
        seq = await db.value("SELECT last_seq + 1 FROM sessions WHERE id = %(sid)s", {"sid": sid})
        message_id = f"msg_q{uuid.uuid4().hex[:20]}"
        params = {"id": message_id, "sid": sid, "seq": seq, "text": question}
        await db.run(_QUESTION, {**params, **token_count("user", question)})
        turn = Turn(
            id=f"trn_q{uuid.uuid4().hex[:12]}",
            session_id=sid,
            tenant_id="northwind",
            user_id="cust_2291",
            user_message_id=message_id,
            user_seq=seq,
            state="building_context",
        )
        tenant = TenantConfig()
        budgets = builder._budgets(tenant)
        counter = counter_for(None)
        tools = tenant_tools(tenant)
        current_slots = await slots.get_slots(db, session_id=sid)
        packed, plan = await builder._assemble(
            (db, db),
            TurnFacts(**{f.name: getattr(turn, f.name) for f in fields(TurnFacts)}),
            tenant,
            budgets,
            counter,
            tools,
            choose_path(tools),
            step=0,
            current_slots=current_slots,
        )
        await db.rollback()
    start = plan["window_from_seq"] or seq
    shown = set(range(start, seq))
    for block in packed.kept:  # the recalled lines that made it into the prompt
        if block.kind == "recall":
            for recalled in block.messages:
                shown |= {int(s) for s in RECALLED_SEQ.findall(str(recalled["content"]))}
    blocks = {b.kind: b.tokens for b in packed.kept}
    context = sum(v for k, v in blocks.items() if k not in ("instructions", "state", "current"))
    return shown, context


_QUESTION = """
    INSERT INTO messages (id, session_id, seq, role, status, text, token_count, token_counter)
    VALUES (%(id)s, %(sid)s, %(seq)s, 'user', 'complete', %(text)s, %(token_count)s,
        %(token_counter)s)
"""


async def locomo_table(
    settings: Settings,
    db_sessions: Database,
    *,
    share: float,
    paths: list[Path] | None = None,
) -> list[dict[str, Any]]:
    """Full-text recall, then hybrid recall where the embeddings extra is installed."""
    data = load_locomo(paths or [DATA])
    if not data:
        return []
    embedder = build_embedder(settings.model_copy(update={"embeddings": "local-minilm"}))
    results = []
    for use in (None, embedder) if embedder is not None else (None,):
        for name, conv in data.items():
            results.append(await locomo_one(settings, db_sessions, name, conv, share, use))
    return results


def load_locomo(paths: list[Path]) -> dict[str, dict[str, Any]]:
    """Conversations by name from bench/data/locomo3.json (slimmed: no photo captions), the
    upstream locomo10.json, or upstream single-conversation files (`locomo10_v2/26.json`,
    named `conv-26`), which keep each shared photo's caption."""
    found: dict[str, dict[str, Any]] = {}
    for path in paths:
        if not path.exists():
            continue
        data = json.loads(path.read_text())
        if isinstance(data, list):  # the upstream locomo10.json
            found.update({d["sample_id"]: _upstream(d) for d in data})
        elif "speaker_a" in data:  # one upstream conversation
            found[f"conv-{path.stem}"] = _upstream({"conversation": data, "qa": data["qa"]})
        else:
            found.update(data)
    return found


def _upstream(sample: dict[str, Any]) -> dict[str, Any]:
    conv = sample["conversation"]
    sessions = []
    n = 1
    while f"session_{n}" in conv:
        sessions.append(
            {"date_time": conv.get(f"session_{n}_date_time"), "turns": conv[f"session_{n}"]}
        )
        n += 1
    return {
        "speaker_a": conv["speaker_a"],
        "speaker_b": conv["speaker_b"],
        "sessions": sessions,
        "qa": sample["qa"],
    }


def render_memory(results: dict[str, Any]) -> str:
    """(c), (d) and (e), each from its own figures or its failure (a failed part costs only
    its own table)."""
    lines = [""]
    parts = (("(c)", "tokens", render_tokens), ("(d)", "done", render_done))
    for label, part, render in parts:
        if failed(results[part]):
            lines.append(f"{label} FAILED: {results[part]['error']}")
        else:
            lines.extend(render(results[part]))
        if part == "tokens" and failed(results.get("tokens_plain")):
            lines.append(
                f"(c) plain-text summarizer row FAILED: {results['tokens_plain']['error']}"
            )
        lines.append("")
    lines.extend(_render_locomo(results))
    return "\n".join(lines)


def _render_locomo(results: dict[str, Any]) -> list[str]:
    lines = [
        f"(e) LoCoMo evidence recall (categories 1-4; conversation budget "
        f"{results['locomo_share'] * 100:.1f}% of the conversation's tokens)"
    ]
    if results.get("locomo_skipped"):
        return [*lines, "  skipped (--no-locomo)"]
    if failed(results["locomo"]):
        return [*lines, f"  FAILED: {results['locomo']['error']}"]
    if not results["locomo"]:
        lines.append("  no data file (bench/data/locomo3.json)")
    if all(r.get("recall") != "hybrid" for r in results["locomo"]):
        lines.append("  hybrid: not run (pip install -e '.[embeddings]' and the weights, README)")
    for r in results["locomo"]:
        lines.append(
            f"  {r.get('recall', 'full-text'):<9} "
            f"{r['conversation']:<9} messages {r['messages']:>4}  tokens "
            f"{r['conversation_tokens']:>6}  questions {r['questions']:>4}  recall "
            f"{r['evidence_recall'] * 100:5.1f}%  context {r['mean_context_tokens']:7.0f} "
            f"tok = {r['footprint'] * 100:4.1f}% of the conversation  missed by category "
            + (" ".join(f"{c}:{n}" for c, n in r.get("missed_by_category", {}).items()) or "-")
        )
    return lines


async def measure_memory(
    base_url: str,
    token: str,
    settings: Settings,
    db_sessions: Database,
    *,
    done_turns: int = 15,
    reading_pause_s: float = 2.0,
    locomo_share: float = 0.11,
    locomo_only: bool = False,
    locomo: bool = True,
    locomo_data: list[Path] | None = None,
) -> dict[str, Any]:
    if locomo_only:
        return {
            "tokens": [],
            "done": {},
            "locomo_share": locomo_share,
            "locomo": await locomo_table(
                settings, db_sessions, share=locomo_share, paths=locomo_data
            ),
        }
    client = ParleyClient(base_url, token)
    try:
        tokens = await guarded("memory (c)", lambda: _token_tables(client, db_sessions, (20, 50)))
        done = await guarded(
            "memory (d)",
            lambda: time_to_done(
                client, db_sessions, settings, SCRIPT, turns=done_turns, pause_s=reading_pause_s
            ),
        )
    finally:
        await client.aclose()
    return {
        "tokens": tokens,
        "done": done,
        "locomo_share": locomo_share,
        "locomo": (
            await guarded(
                "memory (e)",
                lambda: locomo_table(settings, db_sessions, share=locomo_share, paths=locomo_data),
            )
            if locomo
            else []
        ),
        "locomo_skipped": not locomo,
    }


async def _token_tables(
    client: ParleyClient, db_sessions: Database, lengths: tuple[int, ...]
) -> list[dict[str, Any]]:
    return [await token_table(client, db_sessions, n) for n in lengths]
