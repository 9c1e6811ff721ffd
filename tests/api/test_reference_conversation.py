"""The Northwind reference conversation of design.md, end to end through HTTP and SSE.

Seven turns, including a confirmation, a repeated confirm and a repeated POST. Checked at
each turn: which tools ran with which arguments, the slots, the clarification options, the
facts in the reply, and what the email service accepted.
"""

from __future__ import annotations

import uuid
from typing import Any

import httpx

from tests.support.client import ParleyClient
from tests.support.toolkit import emails, reply


async def tools_ran(client: ParleyClient, session_id: str, after_seq: int) -> list[tuple[str, Any]]:
    messages = await client.messages(session_id, after_seq=after_seq)
    return [
        (call["name"], call["arguments"])
        for m in messages
        if m["role"] == "assistant"
        for call in m.get("tool_calls") or []
    ]


def slot(view: dict[str, Any], name: str) -> Any:
    return view["slots"].get(name, {}).get("value")


async def test_the_northwind_reference_conversation(
    priya: ParleyClient, northwind: httpx.AsyncClient
) -> None:
    emails_before = len(await emails(northwind))
    sid = await priya.new_session()

    # 1. "Where is my order?" -> list_open_orders, no customer id; slot set from the result.
    seq = (await priya.session_view(sid))["last_seq"]
    _, events = await priya.turn(sid, "Where is my order?")
    text = reply(events)
    assert await tools_ran(priya, sid, seq) == [("list_open_orders", {})]
    assert "8472" in text and "shipped" in text and "Oct 30" in text
    view = await priya.session_view(sid)
    assert view["slots"]["active_order_id"]["value"] == "8472"
    assert view["slots"]["active_order_id"]["source"] == "tool:list_open_orders"
    tool_events = [e.data for e in events if e.type == "tool"]
    assert [(t["name"], t["phase"]) for t in tool_events] == [
        ("list_open_orders", "start"),
        ("list_open_orders", "end"),
    ]
    assert tool_events[0]["label"] == "Looking up your orders…"

    # 2. "What about the refund?" -> get_refund(8472), resolved from the slot.
    seq = view["last_seq"]
    _, events = await priya.turn(sid, "What about the refund?")
    text = reply(events)
    assert await tools_ran(priya, sid, seq) == [("get_refund", {"order_id": "8472"})]
    assert "On order 8472" in text and "24.00" in text
    assert "approved" in text and "settling" in text
    assert "R-5102" not in text
    view = await priya.session_view(sid)
    assert slot(view, "active_order_id") == "8472"

    # 3. "Can you email me?" -> a proposal with the masked recipient; nothing is sent.
    seq = view["last_seq"]
    email_key = uuid.uuid4().hex
    posted = await priya.post(sid, "Can you email me?", client_message_id=email_key)
    assert posted.status_code == 202
    email_turn = posted.json()["turn_id"]
    events = await priya.events(sid, email_turn)
    assert events[-1].type == "confirmation_required", [e.type for e in events]
    action = events[-1].data["action"]
    assert action["tool"] == "send_email" and action["status"] == "pending"
    assert action["recipient_masked"] == "p***@example.com"
    assert "8472" in action["summary"]
    assert await tools_ran(priya, sid, seq) == [
        ("propose_email", {"order_id": "8472", "template": "order_status_summary"})
    ]
    view = await priya.session_view(sid)
    assert view["active_turn"]["state"] == "awaiting_confirmation"
    assert view["pending_action"]["id"] == action["id"]
    assert len(await emails(northwind)) == emails_before  # no email without a confirmation

    # 4. Confirm (bound to the action id) -> exactly one email, "sent"/"accepted".
    confirmed = await priya.http.post(f"/v1/sessions/{sid}/actions/{action['id']}/confirm")
    assert confirmed.status_code == 202
    assert confirmed.json()["action"]["status"] == "confirmed"
    rest = await priya.events(sid, email_turn, last_event_id=events[-1].id)
    text = reply(rest)
    assert "sent" in text.lower() or "accepted" in text.lower()
    assert "deliver" not in text.lower()
    assert "p***@example.com" in text
    resolved = [e.data["action"]["status"] for e in rest if e.type == "confirmation_resolved"]
    assert resolved == ["confirmed"]
    sent = (await emails(northwind))[emails_before:]
    assert [(e["to"], e["idempotency_key"]) for e in sent] == [
        ("priya@example.com", f"parley-{action['id']}")
    ]
    assert "8472" in sent[0]["subject"]

    # ...a repeated confirm and a repeated POST of that turn's message send nothing more.
    again = await priya.http.post(f"/v1/sessions/{sid}/actions/{action['id']}/confirm")
    assert again.status_code == 409
    assert again.json()["error"]["code"] == "action_resolved"
    repeat = await priya.post(sid, "Can you email me?", client_message_id=email_key)
    assert repeat.status_code == 200 and repeat.json()["turn_id"] == email_turn
    assert len(await emails(northwind)) == emails_before + 1
    view = await priya.session_view(sid)
    assert view["active_turn"] is None and view["pending_action"] is None

    # 5. "Thanks. And the other one?" -> one clarification with concrete options, no guess.
    seq = view["last_seq"]
    _, events = await priya.turn(sid, "Thanks. And the other one?")
    clarifications = [e.data for e in events if e.type == "clarification"]
    assert len(clarifications) == 1
    options = clarifications[0]["options"]
    assert [o["label"] for o in options] == ["Order 8390", "Refund R-5102"]
    assert await tools_ran(priya, sid, seq) == []  # no guessing, so no tool
    assert reply(events) == clarifications[0]["question"]
    view = await priya.session_view(sid)
    assert slot(view, "active_order_id") == "8472"  # unchanged until the user picks

    # 6. "The order. Can I still return it?" -> slot moves to 8390 on the change of referent.
    seq = view["last_seq"]
    _, events = await priya.turn(sid, "The order. Can I still return it?")
    text = reply(events)
    assert await tools_ran(priya, sid, seq) == [("check_return_eligibility", {"order_id": "8390"})]
    assert "4 days" in text and "8390" in text
    view = await priya.session_view(sid)
    assert view["slots"]["active_order_id"] == {
        "value": "8390",
        "source": "clarification",
        "set_at_seq": seq + 1,
    }
    assert "pending_clarification" not in view["slots"]

    # 7. "When did it arrive?" -> Oct 2, about 8390 (not the stale 8472).
    seq = view["last_seq"]
    _, events = await priya.turn(sid, "When did it arrive?")
    text = reply(events)
    assert await tools_ran(priya, sid, seq) == [("get_order", {"order_id": "8390"})]
    assert "Oct 2" in text and "8390" in text and "8472" not in text

    assert len(await emails(northwind)) == emails_before + 1
