"""Forgetting one message (issue 28, acceptance 2) through the public API, with the real
PostgreSQL and Temporal: a canary the user stated is, before, in the message, its full-text
vector, the event log, later prompts, a pinned fact and the summary that folded it; after the
DELETE it is nowhere in the database (every text and JSON column, found through the
catalogue), a replay of its turn's stream carries none of it, the summary is a new version
without it, and the rest of the conversation is where it was. Then the answers the route
gives to another user, a running turn and a second DELETE."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

from sqlalchemy import select, update

from parley.activities.memory import MemoryActivities
from parley.config import Settings
from parley.contracts import SummarizeInput
from parley.gateway.base import Finish, ModelRequest, StreamEvent, TextDelta
from parley.gateway.registry import ProviderPool
from parley.store.db import Database
from parley.store.models import ChatSession, ConversationSummary, Message, UserMemoryItem
from tests.support.canary import scan
from tests.support.client import ParleyClient
from tests.support.orm import orm
from tests.support.toolkit import eventually, propose

PRIYA = {"tenant_id": "northwind", "user_id": "cust_2291"}
FILLER = "Question number {n} about the delivery of order 8472, with a few more words."


def canary(kind: str) -> str:
    # Lowercase letters and digits: a tsvector keeps it whole (tests/support/canary.py).
    return f"canary{kind}{uuid.uuid4().hex[:10]}"


async def versions(sessions: Database, session_id: str) -> list[ConversationSummary]:
    async with orm(sessions) as db:
        rows = await db.scalars(
            select(ConversationSummary)
            .where(ConversationSummary.session_id == session_id)
            .order_by(ConversationSummary.id)
        )
        return list(rows)


async def forget(client: ParleyClient, sid: str, message_id: str) -> Any:
    return await client.http.delete(f"/v1/sessions/{sid}/messages/{message_id}")


async def test_a_forgotten_message_is_nowhere_and_the_rest_is_intact(
    priya: ParleyClient, sessions: Database, settings: Settings
) -> None:
    gone, kept_before, kept_after = canary("forget"), canary("keepa"), canary("keepb")
    sid = await priya.new_session()
    await priya.turn(sid, f"Please note the reference {kept_before} for my records.")
    posted = await priya.post(sid, f"My account nickname is {gone}. Where is order 8472?")
    assert posted.status_code == 202, posted.text
    message, turn_id = posted.json()["message"], posted.json()["turn_id"]
    answered = await priya.events(sid, turn_id)
    assert answered[-1].type == "done" and answered[-1].data["message"]["text"]
    await priya.turn(sid, f"And keep the reference {kept_after} on file as well.")
    for n in range(1, 9):
        await priya.turn(sid, FILLER.format(n=n))

    async def folded() -> ConversationSummary | None:
        found = await versions(sessions, sid)
        return next((v for v in found if message["seq"] in (v.folded_seqs or [])), None)

    await eventually(folded, timeout=60, what="a summary version folds the canary's message")
    before = await scan(settings.database_url, [gone, kept_before, kept_after])
    # Where the canary lives before: the assertion this test exists to turn around.
    for place in ("messages.text", "messages.tsv", "pinned_facts.value"):
        assert place in before[gone], before[gone]
    assert "model_calls.request" in before[gone]  # the later turns' prompts showed it
    newest_before = max(v.id for v in await versions(sessions, sid))

    response = await forget(priya, sid, message["id"])
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["message_id"] == message["id"] and message["id"] in body["message_ids"]
    removed = body["removed"]
    assert removed["messages"] == len(body["message_ids"]) >= 2  # the question and its answer
    assert removed["pinned_facts"] == 1 and removed["summaries"] >= 1
    assert removed["events"] >= 1 and removed["prompts"] >= 1

    assert (await scan(settings.database_url, [gone]))[gone] == {}

    # The summary is rewritten from the messages that remain, by the summary workflow.
    async def rewritten() -> ConversationSummary | None:
        newer = [v for v in await versions(sessions, sid) if v.id > newest_before]
        return newer[-1] if newer else None

    rewrite = await eventually(rewritten, timeout=60, what="a new summary version")
    assert message["seq"] not in (rewrite.folded_seqs or [])
    assert gone not in json.dumps(rewrite.lines)

    after = await scan(settings.database_url, [gone, kept_before, kept_after])
    assert after[gone] == {}, after[gone]
    for kept in (kept_before, kept_after):
        for place in ("messages.text", "messages.tsv", "turn_events.data"):
            assert after[kept].get(place) == before[kept].get(place), (kept, place)

    # A replay of the forgotten turn from its first event: whole, ended, and without the text.
    # The answer went with the question: its deltas append nothing, `done` shows no text.
    replay = await priya.events(sid, turn_id)
    assert [e.id for e in replay] == [e.id for e in answered]
    assert replay[-1].type == "done" and replay[-1].data["message"]["text"] == ""
    assert all(e.data["text"] == "" for e in replay if e.type == "delta")
    assert any(e.type == "delta" and e.data["text"] for e in answered)
    assert all(gone not in json.dumps(e.data) for e in replay)
    listed = [m["id"] for m in await priya.messages(sid)]
    assert message["id"] not in listed and len(listed) >= 2 * 10

    # Idempotent in effect: a second DELETE finds nothing to forget.
    again = await forget(priya, sid, message["id"])
    assert again.status_code == 404 and again.json()["error"]["code"] == "not_found"


async def test_another_users_message_is_not_found(priya: ParleyClient, marco: ParleyClient) -> None:
    sid = await priya.new_session()
    await priya.turn(sid, "Where is order 8472?")
    [mine, *_] = await priya.messages(sid)
    own = await marco.new_session()
    for session in (sid, own):  # her session, or his own session naming her message
        response = await forget(marco, session, mine["id"])
        assert response.status_code == 404, response.text
        assert response.json()["error"]["code"] == "not_found"
    assert mine["id"] in [m["id"] for m in await priya.messages(sid)]


async def test_a_running_turns_message_is_a_conflict(priya: ParleyClient) -> None:
    sid = await priya.new_session()
    turn_id, _, action = await propose(priya, sid)  # the turn rests on a confirmation card
    view = await priya.turn_view(sid, turn_id)
    messages = await priya.messages(sid)
    asked = next(m for m in messages if m["seq"] == view["user_seq"])
    response = await forget(priya, sid, asked["id"])
    assert response.status_code == 409, response.text
    assert response.json()["error"]["code"] == "turn_in_progress"
    declined = await priya.http.post(f"/v1/sessions/{sid}/actions/{action['id']}/decline")
    assert declined.status_code == 202
    assert asked["id"] in [m["id"] for m in await priya.messages(sid)]


async def test_a_memory_item_the_message_wrote_goes_with_it(
    priya: ParleyClient, sessions: Database
) -> None:
    assert (await priya.http.put("/v1/memory/consent", json={"consent": True})).status_code == 200
    try:
        sid = await priya.new_session()
        posted = await priya.post(sid, "Please contact me by phone.")
        message_id = posted.json()["message"]["id"]
        await priya.events(sid, posted.json()["turn_id"])
        source = f"message:{message_id}"

        async def item() -> UserMemoryItem | None:
            async with orm(sessions) as db:
                return await db.scalar(select(UserMemoryItem).filter_by(**PRIYA, source=source))

        assert await item() is not None
        response = await forget(priya, sid, message_id)
        assert response.status_code == 200, response.text
        assert response.json()["removed"]["memory_items"] == 1
        assert await item() is None
    finally:
        await priya.http.put("/v1/memory/consent", json={"consent": False})


async def test_an_answer_goes_alone_and_a_tool_round_goes_whole(priya: ParleyClient) -> None:
    sid = await priya.new_session()
    await priya.turn(sid, "Where is order 8472?")
    messages = await priya.messages(sid)
    roles = [m["role"] for m in messages]
    assert "tool" in roles, roles  # the demo model looked the order up
    question, answer = messages[0], messages[-1]
    round_ids = {m["id"] for m in messages if m["role"] == "tool" or m.get("tool_calls")}

    response = await forget(priya, sid, next(m["id"] for m in messages if m["role"] == "tool"))
    assert response.status_code == 200, response.text
    assert set(response.json()["message_ids"]) == round_ids  # never a call without its result
    response = await forget(priya, sid, answer["id"])
    assert response.status_code == 200, response.text
    assert response.json()["message_ids"] == [answer["id"]]
    assert [m["id"] for m in await priya.messages(sid)] == [question["id"]]


class ForgetsWhileAsked:
    """A summarizer during whose call the user forgets the first message: the pass it serves
    read that message before it went."""

    name = "forgetful"

    def __init__(self, client: ParleyClient, sid: str, message_id: str) -> None:
        self.client, self.sid = client, sid
        self.message_id: str | None = message_id
        self.asked = 0

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
        self.asked += 1
        if self.message_id is not None:  # the first call only
            response = await forget(self.client, self.sid, self.message_id)
            assert response.status_code == 200, response.text
            self.message_id = None
        yield TextDelta(json.dumps({"lines": [], "facts": []}))
        yield Finish("stop", {"input_tokens": 10, "output_tokens": 5})


async def test_a_summary_pass_that_read_a_forgotten_message_saves_nothing(
    priya: ParleyClient, sessions: Database, settings: Settings
) -> None:
    sid = await priya.new_session()
    said = [("user", f"My account nickname is {canary('race')}.")]
    for n in range(6):
        said += [("user", FILLER.format(n=n)), ("assistant", f"Answer {n}: it is on its way.")]
    ids = [f"msg_{uuid.uuid4().hex[:20]}" for _ in said]
    async with orm(sessions) as db:
        for seq, ((role, text), message_id) in enumerate(zip(said, ids, strict=True), start=1):
            db.add(Message(id=message_id, session_id=sid, seq=seq, role=role, text=text))
        await db.execute(update(ChatSession).where(ChatSession.id == sid).values(last_seq=seq))
        await db.commit()
    tight = settings.model_copy(
        update={
            "context_conversation_tokens": 300,
            "summary_min_new_tokens": 1,
            "model_provider": "forgetful",
            "model": "forgetful-model",
        }
    )
    model = ForgetsWhileAsked(priya, sid, ids[0])
    memory = MemoryActivities(
        sessions=sessions, providers=ProviderPool(tight, primary=model), settings=tight
    )
    result = await memory.summarize(SummarizeInput(sid, "trn_race"))
    assert model.asked >= 1 and not result.summarized
    assert await versions(sessions, sid) == []
    # The next pass folds what remains.
    assert (await memory.summarize(SummarizeInput(sid, "trn_race"))).summarized
    [version] = await versions(sessions, sid)
    assert version.folded_seqs and 1 not in version.folded_seqs
