"""The built-in deterministic `demo` model: a Northwind support assistant without a network.

It reads the packed context exactly as a real model would receive it (the server's state
block, the conversation, this turn's tool results) and either asks for a tool or answers.
Every fact in an answer is copied from a tool result or the state block: it never invents
a status, a date or an amount. Same request, same words, every time, streamed token by
token with a configurable delay; it counts its tokens so tests can see generation stop.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import date
from typing import Any

from parley.consented import read_hints
from parley.context import read_state_block, unfence
from parley.fold import extractive_summary
from parley.gateway.base import Finish, ModelRequest, StreamEvent, TextDelta, ToolCallRequest
from parley.gateway.demo_files import answer_from_files
from parley.gateway.demo_handoff import case_summary
from parley.gateway.demo_hints import contact_answer, note_over_results
from parley.gateway.demo_mcp import next_step as outside_step
from parley.gateway.demo_orders import next_step as orders_step
from parley.gateway.demo_policy import policy_answer
from parley.gateway.demo_returns import next_step as returns_step
from parley.gateway.demo_skills import next_step as skills_step
from parley.handoffs import OPENED_TEXT, is_case_summary_request
from parley.knowledge import read_passages
from parley.memory import is_summary_request
from parley.prompt import PASTE_NONE, PASTE_SOME
from parley.tokens import count_message, count_messages, count_tools, default_counter

_TOKEN = re.compile(r"\S+\s*|\s+")


def tokenize(text: str) -> list[str]:
    return _TOKEN.findall(text)


@dataclass
class Reply:
    text: str = ""
    tool_calls: list[ToolCallRequest] = field(default_factory=list)


def _day(value: str | None) -> str:
    """'2026-10-02' -> 'Oct 2'."""
    if not value:
        return "an unknown date"
    d = date.fromisoformat(value)
    return f"{d:%b} {d.day}"


def _money(amount: dict[str, Any]) -> str:
    return f"{amount['currency']} {amount['amount']}"


# Asking for a person ("I want to talk to a person", "could a representative help me?"), not a
# person or an agent mentioned ("my agent found me a flat", "a caring person"): a long chat
# brought in or typed says those often, and each would hand the session to the support team.
_ASKS_FOR_PERSON = re.compile(
    r"\brepresentative\b"
    r"|\b(?:(?:talk|speak|chat)\s+(?:to|with)|want|need|get\s+me)\s+(?:a|an|some|the)?\s*"
    r"(?:real\s+|live\s+)?(?:human|person|agent)\b"
    r"|\b(?:a|an)\s+(?:real\s+|live\s+)?(?:human|person|agent)\s+help\b"
)


def _intent(text: str) -> str:
    t = text.lower()
    if _ASKS_FOR_PERSON.search(t):
        return "handoff"
    if re.search(r"\be-?mail\b", t):
        return "email"
    if "refund" in t:
        return "refund"
    if re.search(r"\breturn", t):
        return "return"
    if re.search(r"\b(arriv\w*|deliver\w*|when did)\b", t):
        return "arrival"
    if re.search(r"\b(where|status|track\w*|order|shipp\w*)\b", t):
        return "status"
    if re.search(r"\b(thanks|thank you|hi|hello)\b", t):
        return "smalltalk"
    return "unknown"


class _Context:
    """What the model can read in the request."""

    def __init__(self, request: ModelRequest) -> None:
        messages = request.messages
        self.state = read_state_block(messages) or {}
        last_user = max(
            (i for i, m in enumerate(messages) if m["role"] == "user"), default=len(messages)
        )
        self.user_text = str(messages[last_user]["content"]) if last_user < len(messages) else ""
        self.calls_this_turn = [
            call for m in messages[last_user + 1 :] for call in m.get("tool_calls") or []
        ]
        self.results: dict[str, dict[str, Any]] = {}
        for m in messages[last_user + 1 :]:
            if m["role"] == "tool":
                payload = json.loads(unfence(m["content"]))
                self.results[payload["name"]] = payload["result"]
        self.earlier_messages = sum(
            1 for m in messages[:last_user] if m["role"] in ("user", "assistant")
        )
        # Durable-memory hints: unverified, below tool results (gateway/demo_hints.py).
        self.hints = read_hints(messages)
        self.offered = {t["name"] for t in request.tools}

    @property
    def resolution(self) -> dict[str, Any]:
        return dict(self.state.get("resolution") or {})

    @property
    def order_id(self) -> str | None:
        value = self.resolution.get("order_id")
        return str(value) if value else None

    def call(self, name: str, **arguments: Any) -> Reply:
        if name not in self.offered:  # like a real model, it calls only what it is offered
            return Reply(NO_TOOLS_TEXT)
        call_id = f"call_{len(self.calls_this_turn) + 1}_{name}"
        return Reply(tool_calls=[ToolCallRequest(call_id, name, json.dumps(arguments))])


# What the demo model says when the step it would take needs a tool it was not offered.
NO_TOOLS_TEXT = (
    "I can't look that up from here: checking orders isn't available in this conversation. "
    "I can answer from what we've discussed and from our help articles."
)


def compose_reply(request: ModelRequest) -> Reply:
    if is_case_summary_request(request.messages):  # a hand-off's case summary, for a person
        return Reply(case_summary(json.loads(request.messages[1]["content"])))
    if is_summary_request(request.messages):
        # The transcript is the first user message (a repair prompt adds messages after it).
        transcript = json.loads(request.messages[1]["content"])
        return Reply(json.dumps(extractive_summary(transcript), sort_keys=True))
    ctx = _Context(request)
    handed = returns_step(request.tools, ctx.user_text, ctx.results)  # gateway/demo_returns.py
    if handed is not None:
        return ctx.call(handed.tool, **handed.arguments) if handed.tool else Reply(handed.text)
    outside = outside_step(request.tools, ctx.state, ctx.user_text, ctx.results)  # MCP tools
    if outside is not None:
        return ctx.call(outside.tool, **outside.arguments) if outside.tool else Reply(outside.text)
    skill = skills_step(request.tools, ctx.user_text, ctx.results)  # skills in a sandbox
    if skill is not None:
        return ctx.call(skill.tool, **skill.arguments) if skill.tool else Reply(skill.text)
    action = ctx.state.get("action")
    if action and action.get("status") != "pending":
        return Reply(_about_action(action))
    from_files = answer_from_files(request.messages, ctx.user_text)  # attached files
    if from_files is not None:
        return Reply(from_files)
    orders = orders_step(ctx.state, ctx.user_text, ctx.results)  # order searches
    if orders is not None:
        return ctx.call(orders.tool, **orders.arguments) if orders.tool else Reply(orders.text)
    if ctx.results:
        text = _from_results(ctx)
        note = note_over_results(ctx.hints, ctx.results)
        text = f"{text} {note}" if note else text
        assumption = ctx.resolution.get("assumption")
        return Reply(f"{assumption} {text}" if assumption else text)
    # Policy questions are answered from the knowledge passages (gateway/demo_policy.py).
    policy = policy_answer(ctx.user_text, read_passages(request.messages))
    if policy is not None:
        return Reply(policy)
    return _next_step(ctx)


def _next_step(ctx: _Context) -> Reply:
    if PASTE_NONE in ctx.user_text:
        return Reply(
            "The text you pasted is too long for me to read in one go, and I couldn't tell "
            "which part your question is about. Which part should I focus on?"
        )
    if PASTE_SOME in ctx.user_text:
        return Reply(
            "Your paste was too long to read whole, so I read only the parts that match "
            "your question; tell me if I should look at another part."
        )
    hinted = contact_answer(ctx.user_text, ctx.hints)
    if hinted is not None:
        return Reply(hinted)
    intent, order_id = _intent(ctx.user_text), ctx.order_id
    if intent == "handoff":
        return ctx.call("handoff_to_human", reason=" ".join(ctx.user_text.split())[:200])
    if intent == "email":
        if order_id is None:
            return Reply("Which order would you like me to email you about?")
        template = "order_status_summary"
        if "refund" in ctx.user_text.lower():
            template = "refund_status"
        return ctx.call("propose_email", order_id=order_id, template=template)
    if intent in ("refund", "return", "arrival", "status") and order_id is not None:
        tool = {
            "refund": "get_refund",
            "return": "check_return_eligibility",
            "arrival": "get_order",
            "status": "get_order",
        }[intent]
        return ctx.call(tool, order_id=order_id)
    if intent in ("refund", "return", "arrival", "status"):
        return ctx.call("list_open_orders")
    if intent == "smalltalk":
        return Reply("You're welcome! Is there anything else I can check on your orders?")
    return Reply(
        "I can look up your orders and refunds, check whether an order can be returned, "
        "and email you a summary. What would you like to know?"
    )


def _from_results(ctx: _Context) -> str:
    intent = _intent(ctx.user_text)
    parts: list[str] = []
    for name, result in ctx.results.items():
        if "error" in result:
            parts.append(_about_error(name, result["error"], ctx.order_id))
        elif name == "list_open_orders":
            parts.append(_about_open_orders(result["orders"]))
        elif name == "get_order":
            parts.append(_about_order(result, intent))
        elif name == "get_refund":
            parts.append(_about_refund(result))
        elif name == "check_return_eligibility":
            parts.append(_about_return(result))
        elif name == "propose_email":
            parts.append(
                f"I've prepared an email with the status of order {result['order_id']} for your "
                f"address on file ({result['recipient_masked']}). Nothing is sent until you "
                "confirm."
            )
        elif name == "handoff_to_human":
            parts.append(OPENED_TEXT)
    return " ".join(parts)


def _about_open_orders(orders: list[dict[str, Any]]) -> str:
    if not orders:
        return "You have no open orders right now."
    return " ".join(_about_order(order, "status") for order in orders)


def _about_order(order: dict[str, Any], intent: str) -> str:
    number, status = order["order_id"], order["status"]
    if status == "delivered" or order.get("delivered_on"):
        return f"Order {number} arrived on {_day(order.get('delivered_on'))}."
    if status == "shipped":
        eta = f" and is expected to arrive on {_day(order['eta'])}" if order.get("eta") else ""
        return f"Your order {number} has shipped (on {_day(order.get('shipped_on'))}){eta}."
    if intent == "arrival":
        return f"Order {number} has not arrived yet; its status is {status}."
    return f"Your order {number} is {status}; it has not shipped yet."


def _about_refund(refund: dict[str, Any]) -> str:
    order, amount = refund["order_id"], _money(refund["amount"])
    if refund["status"] == "completed":
        return (
            f"On order {order}, your refund {refund['refund_id']} of {amount} was completed "
            f"on {_day(refund.get('completed_on'))}."
        )
    stage = f" and {refund['stage']}" if refund.get("stage") else ""
    return (
        f"On order {order}, your refund {refund['refund_id']} of {amount} is "
        f"{refund['status']}{stage} (approved on {_day(refund.get('approved_on'))})."
    )


def _about_return(result: dict[str, Any]) -> str:
    order = result["order_id"]
    if result.get("eligible"):
        days = result.get("days_left")
        left = "today is the last day" if days == 0 else f"you have {days} days left"
        return (
            f"Yes, order {order} can still be returned: it arrived on "
            f"{_day(result.get('delivered_on'))} and the {result.get('window_days', 30)}-day "
            f"window ends on {_day(result.get('window_ends'))}, so {left}."
        )
    if result.get("reason") == "not_delivered":
        return f"Order {order} has not arrived yet, so its return window has not started."
    return f"No, the return window for order {order} ended on {_day(result.get('window_ends'))}."


def _about_error(name: str, error: dict[str, Any], order_id: str | None) -> str:
    code = error.get("code")
    if code == "not_found":
        subject = f"order {order_id}" if order_id else "that"
        return f"I couldn't find {subject} on your account."
    if code == "unavailable":
        return (
            "I couldn't reach the order system just now, so I can't check that. Please try "
            "again in a few minutes, or I can pass this to a person."
        )
    return "Something went wrong while I was looking that up, so I can't answer it yet."


def _about_action(action: dict[str, Any]) -> str:
    status, recipient = action.get("status"), action.get("recipient_masked")
    if status == "executed":
        return (
            f"Sent: {action.get('summary')} went to your address on file ({recipient}). "
            "The email service accepted it for sending."
        )
    if status == "unknown":
        return (
            "I couldn't confirm whether the email was sent. I'll check with the email "
            "service before sending anything again."
        )
    if status == "failed":
        return "The email could not be sent. Nothing went out; you can ask me to try again."
    if status == "expired":
        return "The confirmation expired, so I did not send the email."
    return "OK, I won't send the email."


class DemoModel:
    name = "demo"

    def __init__(self, *, token_delay_s: float = 0.015) -> None:
        self.token_delay_s = token_delay_s
        self.tokens_emitted = 0
        self.calls = 0
        # The last prompt per cache key: the demo reports the shared prefix as cached tokens,
        # the way providers with prefix caching do.
        self._prefixes: dict[str, list[dict[str, Any]]] = {}

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
        self.calls += 1
        reply = compose_reply(request)
        tokens = tokenize(reply.text)
        # Nobody watches a summary being written: it comes at once.
        delay = 0.0 if is_summary_request(request.messages) else self.token_delay_s
        for token in tokens:
            if delay:
                await asyncio.sleep(delay)
            self.tokens_emitted += 1
            yield TextDelta(token)
        for call in reply.tool_calls:
            if delay:
                await asyncio.sleep(delay)
            yield call
        counter = default_counter()
        usage = {
            "input_tokens": count_messages(counter, request.messages)
            + count_tools(counter, request.tools),
            "output_tokens": len(tokens) + 10 * len(reply.tool_calls),
            "cached_tokens": self._cached(request),
        }
        yield Finish("tool_calls" if reply.tool_calls else "stop", usage)

    def _cached(self, request: ModelRequest) -> int:
        """Tokens of the whole messages this prompt shares with the last one under its key."""
        if not request.cache_key:
            return 0
        previous = self._prefixes.get(request.cache_key, [])
        self._prefixes[request.cache_key] = request.messages
        counter = default_counter()
        shared = 0
        for before, now in zip(previous, request.messages, strict=False):
            if before != now:
                break
            shared += count_message(counter, now)
        return shared + (count_tools(counter, request.tools) if shared else 0)
