"""Runs conversations against a running Parley and records what it saw (`observe.py`).

Conversations run one after another: the emails the demo backend accepted while one ran are
that conversation's, and a tenant configuration applied for a run is in force for all of it.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from parley.eval.client import AdminClient, BackendClient, EvalClientError, Stream, UserClient
from parley.eval.observe import ConversationSeen, StepSeen, ToolSeen
from parley.eval.suite import Conversation, Loaded, Step
from parley.handoffs import OPEN_STATUSES as OPEN_HANDOFF

TokenFor = Callable[[str, str], Awaitable[str]]
Progress = Callable[[int, int, str], None]


@dataclass
class Target:
    """Where and as whom: the API, a token per (tenant, user), an operator's token per
    tenant (configs and usage; None: no tokens counted, no config applied), the demo backend."""

    url: str
    token_for: TokenFor
    admin_token_for: Callable[[str], Awaitable[str | None]]
    backend_url: str | None = None
    # Called after a conversation that switched a backend fault on: the worker's circuit
    # breaker may be open, and the next conversation needs it closed (the CLI waits out the
    # cooldown; a test moves the breaker's clock).
    after_faults: Callable[[], Awaitable[None]] | None = None


async def run_suite(
    suite: list[Loaded], target: Target, progress: Progress | None = None
) -> list[ConversationSeen]:
    # Conversations that switch a fault on run last, so a breaker they open costs no other.
    ready = sorted(
        (item for item in suite if item.conversation.status == "ready"), key=_injects_faults
    )
    backend = BackendClient(target.backend_url) if target.backend_url else None
    if backend is not None and not await backend.reachable():
        await backend.aclose()
        backend = None  # no demo backend here: no fixtures, emails judged by the API alone
    admins: dict[str, AdminClient | None] = {}
    seen: list[ConversationSeen] = []
    try:
        for number, item in enumerate(ready):
            if progress is not None:
                progress(number, len(ready), item.conversation.name)
            tenant = item.conversation.tenant
            if tenant not in admins:
                token = await target.admin_token_for(tenant)
                admins[tenant] = AdminClient(target.url, token) if token else None
            seen.append(await run_conversation(item, target, admins[tenant], backend))
            if _injects_faults(item) and backend is not None and target.after_faults:
                await target.after_faults()
        if progress is not None:
            progress(len(ready), len(ready), "")
    finally:
        for admin in admins.values():
            if admin is not None:
                await admin.aclose()
        if backend is not None:
            await backend.aclose()
    return seen


def _injects_faults(item: Loaded) -> bool:
    state = item.conversation.backend
    return bool(state is not None and state.faults)


async def run_conversation(
    item: Loaded, target: Target, admin: AdminClient | None, backend: BackendClient | None
) -> ConversationSeen:
    conversation = item.conversation
    seen = ConversationSeen(name=conversation.name, path=item.path)
    user = UserClient(target.url, await target.token_for(conversation.tenant, conversation.user))
    before = await backend.emails() if backend is not None else None
    today = await backend.today() if backend is not None else None
    sessions: list[str] = []
    try:
        if backend is not None:
            await _set_backend(backend, conversation)
        await _converse(conversation, user, sessions, seen)
    except EvalClientError as exc:
        seen.crashed = str(exc)
    finally:
        if backend is not None and conversation.backend is not None and today is not None:
            await backend.reset(today)
            for order_id in conversation.backend.carrier_notes or {}:
                await backend.set_carrier_note(conversation.tenant, order_id, None)
        await user.aclose()
    if backend is not None and before is not None:
        seen.emails = (await backend.emails())[len(before) :]
    if admin is not None:
        await _read_runs(admin, conversation.tenant, sessions, seen)
    return seen


async def _set_backend(backend: BackendClient, conversation: Conversation) -> None:
    state = conversation.backend
    if state is None:
        return
    await backend.set_state(today=state.today, faults=state.faults)
    for order_id, note in (state.carrier_notes or {}).items():
        await backend.set_carrier_note(conversation.tenant, order_id, note)


async def _read_runs(
    admin: AdminClient, tenant: str, sessions: list[str], seen: ConversationSeen
) -> None:
    """Tokens per conversation and each turn's trace, from the operator's view."""
    seen.tokens_in, seen.tokens_out = 0, 0
    traces: dict[str, list[dict[str, Any]]] = {}
    for session_id in sessions:
        for run in await admin.session_runs(tenant, session_id):
            seen.tokens_in += int(run["tokens"]["input_tokens"])
            seen.tokens_out += int(run["tokens"]["output_tokens"])
            traces[str(run["turn_id"])] = list(run["trace"])
    for step in seen.steps:
        step.trace = traces.get(step.turn_id or "", [])
    # The conversation's cost: its sessions' lines of the ledger's report for the days it ran.
    today = datetime.now(UTC).date()
    costs = await admin.session_costs(tenant, (today - timedelta(days=1)).isoformat(), str(today))
    seen.cost_usd = str(sum((Decimal(costs.get(s, "0")) for s in sessions), Decimal(0)))


async def _converse(
    conversation: Conversation, user: UserClient, sessions: list[str], seen: ConversationSeen
) -> None:
    resting: tuple[str, str, int | None] | None = None  # turn, action id, last event id
    seen_up_to: dict[str, int] = {}  # the last event id read of each turn
    for number, step in enumerate(conversation.steps, start=1):
        if not sessions or step.new_session:
            sessions.append(await user.new_session())
        session_id = sessions[-1]
        record = StepSeen(
            number=number, kind=_kind(step), text=step.say or "", session_id=session_id
        )
        last_seq = int((await user.session(session_id))["last_seq"])
        if step.say is not None and step.steer is not None:
            steered = await user.say_and_steer(session_id, step.say, step.steer)
            record.turn_id, stream, record.steered = steered.turn_id, steered.stream, steered.taken
        elif step.edit is not None and step.say is not None:
            edited = seen.steps[step.edit - 1].message_id
            record.turn_id, stream = await user.edit(session_id, _named(edited), step.say)
        elif step.say is not None:
            record.turn_id, stream = await user.say(session_id, step.say, seen_up_to)
        elif step.regenerate is not None:
            again = seen.steps[step.regenerate - 1].turn_id
            record.turn_id, stream = await user.regenerate(session_id, _named(again))
        elif step.switch is not None:
            shown = seen.steps[step.switch.step - 1]
            named = shown.answer_id if step.switch.answer else shown.message_id
            stream = Stream(started=time.monotonic())  # no turn runs
            await user.switch(session_id, _named(named), step.switch.version)
        elif resting is None:
            raise EvalClientError(f"step {number}: nothing is waiting for a confirmation")
        else:
            record.turn_id, action_id, after = resting
            started = time.monotonic()
            await user.answer(session_id, action_id, record.kind)
            if record.kind == "confirm":
                seen.confirmed_actions.append(action_id)
            stream = await user.follow(session_id, record.turn_id, started=started, after=after)
        _read_stream(stream, record)
        if stream.events and stream.events[-1].id is not None and record.turn_id:
            seen_up_to[record.turn_id] = stream.events[-1].id
        await _read_state(user, session_id, last_seq, record)
        seen.steps.append(record)
        resting = None
        waiting = record.ends_with == "confirmation_required"  # a switch has no turn
        if record.action is not None and record.turn_id is not None and waiting:
            last_id = stream.events[-1].id if stream.events else None
            resting = (record.turn_id, str(record.action["id"]), last_id)


def _kind(step: Step) -> str:
    if step.edit is not None:
        return "edit"
    if step.say is not None:
        return "say"
    if step.regenerate is not None:
        return "regenerate"
    if step.switch is not None:
        return "switch"
    return "confirm" if step.confirm else "decline"


def _named(found: str | None) -> str:
    """An id an earlier step recorded (a step that stored no message or answer has none)."""
    if found is None:
        raise EvalClientError("the step it refers to stored no message or answer to name")
    return found


def _read_stream(stream: Stream, record: StepSeen) -> None:
    streamed = ""
    for event in stream.events:
        record.events.append(event.type)
        data: dict[str, Any] = event.data if isinstance(event.data, dict) else {}
        if event.type == "delta":
            streamed += str(data.get("text", ""))
        elif event.type == "reset":
            streamed = ""
        elif event.type == "tool" and data.get("phase") == "end":
            record.tools.append(ToolSeen(name=str(data["name"]), status=data.get("status")))
        elif event.type in ("clarification", "interaction"):
            options = [
                str(o.get("label", o)) if isinstance(o, dict) else str(o)
                for o in data.get("options", [])
            ]
            record.clarification = {"question": data.get("question", ""), "options": options}
        elif event.type == "confirmation_required":
            record.action = dict(data["action"])
        elif event.type == "confirmation_resolved":
            record.resolved.append(str(data["action"]["status"]))
        elif event.type == "warning":
            record.warnings.append(str(data.get("code")))
        elif event.type == "citations":
            record.citations.extend(str(s.get("doc")) for s in data.get("sources", []))
        elif event.type == "error":
            record.error = str(data.get("code"))
        elif event.type in ("done", "cancelled"):
            streamed = str(data["message"]["text"])
            record.answer_id = str(data["message"]["id"])
    record.reply = streamed
    record.ends_with = stream.events[-1].type if stream.events else None
    record.first_delta_s = stream.first("delta")
    record.end_s = stream.elapsed


async def _read_state(user: UserClient, session_id: str, last_seq: int, record: StepSeen) -> None:
    """The tool calls the model asked for (with arguments), the slots, the workflow link."""
    for message in await user.messages(session_id, last_seq):
        if message["role"] == "user" and record.message_id is None and record.model_turn:
            record.message_id = str(message["id"])
        for call in message.get("tool_calls") or []:
            _merge_call(record, str(call["name"]), call.get("arguments"))
    view = await user.session(session_id)
    record.slots = {name: slot.get("value") for name, slot in view.get("slots", {}).items()}
    if record.turn_id is not None:
        record.workflow_url = (await user.turn(session_id, record.turn_id)).get("workflow_url")
    case = await user.handoff(session_id)
    record.handoff = case is not None and case["status"] in OPEN_HANDOFF


def _merge_call(record: StepSeen, name: str, arguments: Any) -> None:
    for tool in record.tools:
        if tool.name == name and tool.arguments is None:
            tool.arguments = arguments if arguments is not None else {}
            return
    record.tools.append(ToolSeen(name=name, arguments=arguments if arguments is not None else {}))
