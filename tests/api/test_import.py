"""Importing earlier conversation (`POST /v1/sessions/{sid}/import`, issue 39) through the
session's API, store, worker and Temporal: the messages become history with their original
times and the session's next seqs, indexing runs in the background to `done`, a repeat is the
same import, a malformed item is refused by its index with nothing stored, and a turn after
the import recalls an imported line by full text."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
from sqlalchemy import func, select, update

from parley.config import Settings
from parley.store.db import Database
from parley.store.models import ConversationImport, Message
from tests.support.client import ParleyClient
from tests.support.orm import orm
from tests.support.toolkit import eventually, model_calls, propose

DAY = datetime(2026, 9, 1, 9, 30, tzinfo=UTC)


def items(texts: list[str], *, start: datetime = DAY) -> list[dict[str, Any]]:
    """User and assistant lines in turn, a minute apart from `start`."""
    return [
        {
            "role": "user" if i % 2 == 0 else "assistant",
            "text": text,
            "created_at": (start + timedelta(minutes=i)).isoformat(),
        }
        for i, text in enumerate(texts)
    ]


async def send(
    client: ParleyClient, sid: str, lines: list[dict[str, Any]], key: str | None = None
) -> httpx.Response:
    body = {"client_import_id": key or uuid.uuid4().hex, "items": lines}
    return await client.http.post(f"/v1/sessions/{sid}/import", json=body)


async def until_done(client: ParleyClient, status_url: str) -> dict[str, Any]:
    async def probe() -> dict[str, Any] | None:
        answer = await client.http.get(status_url)
        assert answer.status_code == 200, answer.text
        body = dict(answer.json())
        return body if body["status"] == "done" else None

    return await eventually(probe, timeout=30, what=f"{status_url} reaches done")


async def stored_count(sessions: Database, sid: str) -> tuple[int, int]:
    """The session's messages and imports as stored."""
    async with orm(sessions) as db:
        messages = await db.scalar(select(func.count()).where(Message.session_id == sid))
        made = await db.scalar(select(func.count()).where(ConversationImport.session_id == sid))
    return int(messages or 0), int(made or 0)


async def test_imported_messages_follow_the_session_s_own_with_their_original_times(
    priya: ParleyClient, sessions: Database
) -> None:
    sid = await priya.new_session()
    _, events = await priya.turn(sid, "Where is my order?")
    assert events[-1].type == "done"
    before = await priya.messages(sid)
    lines = items(["I bought a tent in August.", "Noted: a tent, in August.", "Thanks!"])

    answer = await send(priya, sid, lines)

    assert answer.status_code == 202, answer.text
    made = answer.json()
    assert made["messages"] == 3 and made["status"] in ("pending", "indexing", "done")
    assert made["first_seq"] == before[-1]["seq"] + 1 and made["last_seq"] == made["first_seq"] + 2
    after = await priya.messages(sid, after_seq=before[-1]["seq"])
    assert [(m["seq"], m["role"], m["text"]) for m in after] == [
        (made["first_seq"] + i, line["role"], line["text"]) for i, line in enumerate(lines)
    ]
    assert [datetime.fromisoformat(m["created_at"]) for m in after] == [
        datetime.fromisoformat(line["created_at"]) for line in lines
    ]
    assert all(m["turn_id"] is None and m["status"] == "complete" for m in after)
    done = await until_done(priya, made["status_url"])
    assert done["indexed"] == 3 and done["finished_at"] is not None
    async with orm(sessions) as db:  # counted as every stored message is
        counts = await db.scalars(
            select(Message.token_count).where(
                Message.session_id == sid, Message.seq >= made["first_seq"]
            )
        )
        assert all(count and count > 0 for count in counts)
    # The session's next message takes the seq after the import's.
    posted = await priya.post(sid, "And now?")
    assert posted.status_code == 202, posted.text
    assert posted.json()["message"]["seq"] == made["last_seq"] + 1
    await priya.events(sid, posted.json()["turn_id"])


async def test_a_repeat_is_the_same_import_and_the_key_with_other_items_is_refused(
    priya: ParleyClient, sessions: Database
) -> None:
    sid = await priya.new_session()
    lines = items(["Hello from last year.", "Hello again."])
    first = await send(priya, sid, lines, key="import-once")
    assert first.status_code == 202, first.text

    again = await send(priya, sid, lines, key="import-once")
    other = await send(priya, sid, items(["Something else."]), key="import-once")

    assert again.status_code == 200, again.text
    assert again.json()["id"] == first.json()["id"]
    assert other.status_code == 422, other.text
    assert other.json()["error"]["code"] == "idempotency_key_reused"
    assert await stored_count(sessions, sid) == (2, 1)


async def test_a_malformed_item_is_refused_by_its_index_and_nothing_is_stored(
    priya: ParleyClient, sessions: Database
) -> None:
    sid = await priya.new_session()
    good = items(["one", "two", "three", "four"])
    future = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    cases = {
        "role": (1, {**good[1], "role": "system"}),
        "text": (2, {**good[2], "text": "   "}),
        "created_at": (3, {**good[3], "created_at": future}),
    }
    for name, (index, bad) in cases.items():
        lines = [*good[:index], bad, *good[index + 1 :]]
        answer = await send(priya, sid, lines)
        assert answer.status_code == 422, answer.text
        error = answer.json()["error"]
        assert error["code"] == "invalid_request"
        assert error["field"] == f"items.{index}.{name}", error
    out_of_order = [good[1], good[0]]
    answer = await send(priya, sid, out_of_order)
    assert answer.json()["error"]["field"] == "items.1.created_at"
    assert answer.json()["error"]["index"] == 1
    missing = [good[0], {"role": "user", "text": "no time"}]
    answer = await send(priya, sid, missing)
    assert answer.status_code == 422 and answer.json()["error"]["field"] == "items.1.created_at"
    # A number is no date-time in the contract (found by schemathesis: it was read as seconds
    # since 1970 and the import accepted).
    for number in (0, 1764000000, 1764000000.5):
        answer = await send(priya, sid, [good[0], {**good[1], "created_at": number}])
        assert answer.status_code == 422, answer.text
        assert answer.json()["error"]["field"] == "items.1.created_at"
    assert await stored_count(sessions, sid) == (0, 0)


async def test_the_size_is_bounded_by_items_and_by_text(
    priya: ParleyClient, settings: Settings, sessions: Database
) -> None:
    sid = await priya.new_session()
    too_many = items(["x"] * (settings.max_import_messages + 1))
    answer = await send(priya, sid, too_many)
    assert answer.status_code == 422, answer.text
    assert answer.json()["error"]["field"] == "items"
    assert answer.json()["error"]["limit"] == settings.max_import_messages
    too_long = items(["fine", "y" * (settings.max_message_chars + 1)])
    answer = await send(priya, sid, too_long)
    assert answer.status_code == 422, answer.text
    assert answer.json()["error"]["field"] == "items.1.text"
    assert await stored_count(sessions, sid) == (0, 0)


async def test_another_user_s_session_is_not_found(
    priya: ParleyClient, marco: ParleyClient, sessions: Database
) -> None:
    sid = await priya.new_session()
    made = await send(priya, sid, items(["mine"]))
    assert made.status_code == 202, made.text

    answer = await send(marco, sid, items(["not yours"]))
    status = await marco.http.get(made.json()["status_url"])

    assert answer.status_code == 404 and answer.json()["error"]["code"] == "not_found"
    assert status.status_code == 404
    assert await stored_count(sessions, sid) == (1, 1)


async def test_an_import_is_refused_while_a_turn_is_active(
    priya: ParleyClient, sessions: Database
) -> None:
    sid = await priya.new_session()
    turn_id, _, action = await propose(priya, sid)  # the turn rests on its card
    stored = await stored_count(sessions, sid)

    answer = await send(priya, sid, items(["too early"]))

    assert answer.status_code == 409, answer.text
    assert answer.json()["error"]["code"] == "turn_in_progress"
    assert answer.json()["error"]["active_turn_id"] == turn_id
    assert await stored_count(sessions, sid) == stored
    declined = await priya.http.post(f"/v1/sessions/{sid}/actions/{action['id']}/decline")
    assert declined.status_code == 202, declined.text


async def test_a_turn_after_an_import_recalls_an_imported_line_by_full_text(
    priya: ParleyClient, sessions: Database
) -> None:
    """Sixty imported lines are more than the recent window holds, so the turn's prompt
    searches the ones before it: the line about Harbour Lane is recalled, with its date."""
    sid = await priya.new_session()
    filler = [f"Line {i} about the weather and walks in the park, nothing else." for i in range(58)]
    texts = ["My old address was 12 Harbour Lane, if that matters.", "Noted.", *filler]
    made = await send(priya, sid, items(texts))
    assert made.status_code == 202, made.text
    await until_done(priya, made.json()["status_url"])

    turn_id, events = await priya.turn(sid, "What did I tell you about Harbour Lane?")

    assert events[-1].type == "done", [e.type for e in events]
    requests = [c.request for c in await model_calls(sessions, turn_id) if c.provider != "resolver"]
    first_seq = made.json()["first_seq"]
    assert first_seq in requests[0]["budget"]["recalled_seqs"]
    prompt = "\n".join(str(m.get("content")) for m in requests[0]["messages"])
    assert "12 Harbour Lane" in prompt and "2026-09-01" in prompt


async def test_a_question_that_names_a_month_is_shown_that_months_lines_first(
    priya: ParleyClient, sessions: Database
) -> None:
    """Eighty purchases, one a day, say the same words; the question names March 2025, the
    month of the oldest few. Ranked by words alone the newest lines win the recall block; the
    period's lines are shown first."""
    sid = await priya.new_session()
    start = datetime(2025, 3, 20, 9, 0, tzinfo=UTC)
    lines = [
        {
            "role": "user" if i % 2 == 0 else "assistant",
            "text": f"I purchased gadget number {i} from the shop today."
            if i % 2 == 0
            else f"Noted, gadget {i - 1}.",
            "created_at": (start + timedelta(days=i)).isoformat(),
        }
        for i in range(160)
    ]
    made = await send(priya, sid, lines)
    assert made.status_code == 202, made.text
    await until_done(priya, made.json()["status_url"])

    turn_id, events = await priya.turn(sid, "Which gadget did I purchase in March 2025?")

    assert events[-1].type == "done", [e.type for e in events]
    [request] = [
        c.request for c in await model_calls(sessions, turn_id) if c.provider != "resolver"
    ]
    prompt = "\n".join(str(m.get("content")) for m in request["messages"])
    first = made.json()["first_seq"]
    march = [first + i for i in range(0, 12, 2)]  # March 20-31, 2025: the user's lines
    assert set(march) <= set(request["budget"]["recalled_seqs"]), request["budget"]
    assert "2025-03-20" in prompt and "gadget number 0 " in prompt


async def set_status(sessions: Database, import_id: str, status: str) -> None:
    async with orm(sessions) as db:
        await db.execute(
            update(ConversationImport)
            .where(ConversationImport.id == import_id)
            .values(status=status)
        )
        await db.commit()


async def test_recall_while_an_import_is_indexed_is_said_to_be_pending(
    priya: ParleyClient, sessions: Database
) -> None:
    """Recall by meaning finds an imported message only once the import workflow embedded it:
    until then a turn that searches the conversation says so on its stream."""
    sid = await priya.new_session()
    filler = [f"Line {i} about the weather and walks in the park, nothing else." for i in range(60)]
    made = await send(priya, sid, items(filler))
    assert made.status_code == 202, made.text
    await until_done(priya, made.json()["status_url"])
    await set_status(sessions, made.json()["id"], "indexing")  # as while it embeds batches

    _, events = await priya.turn(sid, "What did I say about the park?")

    warnings = [e.data["code"] for e in events if e.type == "warning"]
    assert warnings.count("recall_pending") == 1, warnings
    assert events[-1].type == "done"

    await set_status(sessions, made.json()["id"], "done")
    _, events = await priya.turn(sid, "And about the weather?")
    assert "recall_pending" not in [e.data["code"] for e in events if e.type == "warning"]
