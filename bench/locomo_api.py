"""(n) LoCoMo through the public API, with a summarizer that fails (issue 26, acceptance 4).

Conversation 50 of LoCoMo (bench/data/locomo50.json), sessions 1-15 (271 turns), is posted
turn by turn through `POST /v1/sessions/{id}/messages` as a user would type it (`Speaker:
text`, each answered by the model), to the real stack whose gateway speaks OpenAI's wire
format to a local server (`gateway.fake_provider --brain --summarizer plain`: turns answered
as the demo model would, every summary request answered in prose, so every summary version
is the code fallback). The product's default budgets apply. Once the session's summary run has
finished, each question of categories 1-4 whose evidence lies in the posted sessions is
asked in the same session, and its turn's first model call is read back from
`model_calls`:

- evidence in the prompt: every evidence turn shown verbatim (the recent window, or a line
  the recall block kept), as section (e) counts it;
- footprint: the prompt less standing instructions, tool schemas, state and the question,
  over the whole conversation's tokens (the posted turns as stored; the model's replies are
  in the prompts but not in this denominator, which only makes the figure larger).

Slow (a few hundred turns through the stack), so it is not in the default run:

    .venv/bin/python -m bench --locomo-api-only     # this section alone
    .venv/bin/python -m bench --locomo-api          # added to a full run
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sqlalchemy import select
from temporalio.client import Client

from bench.plain_summarizer import asked_for_summaries, reset, settled
from bench.prompt_figures import Question, context_tokens, footprint, shown_seqs
from bench.stack import Stack, log, provider_stack
from parley.store.db import Database
from parley.store.models import ConversationSummary, Message, ModelCall, Turn
from parley.tokens import MESSAGE_OVERHEAD
from tests.support.client import ParleyClient
from tests.support.orm import orm

DATA = Path(__file__).resolve().parent / "data" / "locomo50.json"
CATEGORIES = (1, 2, 3, 4)


def posted_text(turn: dict[str, Any]) -> str:
    return f"{turn['speaker']}: {turn['text']}"


def askable(conv: dict[str, Any], seqs: dict[str, int]) -> list[dict[str, Any]]:
    """The questions of categories 1-4 whose every evidence turn was posted."""
    return [
        qa
        for qa in conv["qa"]
        if qa["category"] in CATEGORIES
        and qa["evidence"]
        and all(e in seqs for e in qa["evidence"])
    ]


async def answered(client: ParleyClient, sid: str, text: str) -> str:
    """Post `text` and follow its turn to `done`, declining any action it proposes (a turn
    that mentions sending something may propose an email; a user would say no)."""
    turn_id, events = await client.turn(sid, text)
    while events[-1].type == "confirmation_required":
        action_id = events[-1].data["action"]["id"]
        declined = await client.http.post(f"/v1/sessions/{sid}/actions/{action_id}/decline")
        if declined.status_code != 202:
            raise RuntimeError(f"declining {action_id}: {declined.status_code} {declined.text}")
        events = await client.events(sid, turn_id, last_event_id=events[-1].id)
    if events[-1].type != "done":
        raise RuntimeError(f"{text[:60]!r} ended {events[-1].type}")
    return turn_id


async def post_conversation(
    client: ParleyClient, conv: dict[str, Any], sessions: int
) -> tuple[str, list[str], list[dict[str, Any]]]:
    """A new session with the first `sessions` sessions' turns posted one by one, each turn
    followed to its end; returns its id, the turn ids and the turns posted."""
    sid = await client.new_session()
    turns = [t for s in conv["sessions"][:sessions] for t in s["turns"]]
    turn_ids = []
    for n, turn in enumerate(turns, 1):
        turn_ids.append(await answered(client, sid, posted_text(turn)))
        if n % 50 == 0:
            log(f"(n) posted {n} of {len(turns)} turns")
    return sid, turn_ids, turns


async def posted_seqs(
    db_sessions: Database, sid: str, turns: list[dict[str, Any]]
) -> tuple[dict[str, int], int, int]:
    """dia_id -> seq of each posted turn (the session's user messages, in order), the posted
    turns' tokens as stored, and the whole session's (replies too)."""
    async with orm(db_sessions) as db:
        rows = list(
            await db.execute(
                select(Message.seq, Message.role, Message.text, Message.token_count)
                .where(Message.session_id == sid)
                .order_by(Message.seq)
            )
        )
    users = [r for r in rows if r.role == "user"]
    if [r.text for r in users] != [posted_text(t) for t in turns]:
        raise RuntimeError("the session's user messages are not the turns posted")
    seqs = {t["dia_id"]: r.seq for t, r in zip(turns, users, strict=True)}
    posted = sum((r.token_count or 0) + MESSAGE_OVERHEAD for r in users)
    whole = sum((r.token_count or 0) + MESSAGE_OVERHEAD for r in rows)
    return seqs, posted, whole


async def ask(
    client: ParleyClient,
    db_sessions: Database,
    sid: str,
    qa: dict[str, Any],
    seqs: dict[str, int],
) -> Question:
    """Ask one question in the session; what its turn's first model call's prompt showed."""
    turn_id = await answered(client, sid, qa["question"])
    async with orm(db_sessions) as db:
        call, user_seq = (
            await db.execute(
                select(ModelCall, Turn.user_seq)
                .join(Turn, Turn.id == ModelCall.turn_id)
                .where(ModelCall.turn_id == turn_id, ModelCall.provider != "resolver")
                .order_by(ModelCall.step)
                .limit(1)
            )
        ).one()
    request = call.request
    return Question(
        category=qa["category"],
        evidence=frozenset(seqs[e] for e in qa["evidence"]),
        shown=frozenset(shown_seqs(request, user_seq)),
        context=context_tokens(request["budget"]["blocks"]),
        prompt=int(request["budget"]["prompt_tokens"]),
    )


async def measure_locomo_api(
    stack: Stack,
    db_sessions: Database,
    *,
    sessions: int = 15,
    data: Path = DATA,
) -> dict[str, Any]:
    ((name, conv),) = json.loads(data.read_text()).items()
    temporal = await Client.connect(stack.settings.temporal_address)
    async with provider_stack(stack, summarizer="plain") as provider:
        await reset(provider)
        client = ParleyClient(provider.parley_url, stack.token)
        try:
            sid, turn_ids, turns = await post_conversation(client, conv, sessions)
            await settled(temporal, sid, turn_ids)  # the user comes back later
            seqs, posted, whole = await posted_seqs(db_sessions, sid, turns)
            questions = askable(conv, seqs)
            log(f"(n) {len(turns)} turns posted; asking {len(questions)} questions")
            asked = [await ask(client, db_sessions, sid, qa, seqs) for qa in questions]
        finally:
            await client.aclose()
        summarizer = await asked_for_summaries(provider.provider_url)
    async with orm(db_sessions) as db:
        written = list(
            await db.scalars(
                select(ConversationSummary.written_by).where(ConversationSummary.session_id == sid)
            )
        )
    return {
        "conversation": name,
        "sessions": sessions,
        "turns_posted": len(turns),
        "session_tokens": whole,
        "summary_versions": len(written),
        "written_by": sorted(set(written)),
        "summarizer_requests": summarizer["requests"],
        "summarizer_input_tokens": summarizer["input_tokens"],
        **footprint(asked, posted),
    }


def render_locomo_api(r: dict[str, Any]) -> str:
    missed = " ".join(f"{c}:{n}" for c, n in r["missed_by_category"].items()) or "-"
    return "\n".join(
        [
            "",
            f"(n) LoCoMo {r['conversation']} through the API, sessions 1-{r['sessions']} "
            f"({r['turns_posted']} turns posted), the summarizer answering in prose "
            "(default budgets)",
            f"  questions {r['questions']} (categories 1-4)  evidence in prompt "
            f"{r['evidence_in_prompt'] * 100:5.1f}%  missed by category {missed}",
            f"  footprint {r['footprint'] * 100:4.1f}% (issue 26: at most 10%): context "
            f"{r['mean_context_tokens']:.0f} tok on average (largest "
            f"{r['largest_context_tokens']}) of the conversation's {r['conversation_tokens']} "
            f"(with the model's replies {r['session_tokens']}); whole prompt "
            f"{r['mean_prompt_tokens']:.0f} tok on average",
            f"  summary versions {r['summary_versions']} written by "
            f"{', '.join(r['written_by']) or '-'}; the server was asked "
            f"{r['summarizer_requests']} summary requests of {r['summarizer_input_tokens']} "
            "input tokens",
        ]
    )
