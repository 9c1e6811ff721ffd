"""The Returns specialist as an agent loop of its own, for a real model.

With the demo model the specialist's steps stay fixed by code (workflows/specialist.py,
`_work`). With a real provider the specialist is given its persona, its instructions and
four tools of its own, and decides the steps itself; code still owns what matters: a
question reaches the user as an `interaction` with the options the model chose, a return
is only proposed (the user's confirm creates it, under the action's idempotency key), and
the loop is bounded (`AGENT_MAX_STEPS` model calls, `MAX_TOOL_CALLS_PER_RESPONSE` calls run
per reply).

A reply the loop cannot use is answered, never trusted: malformed arguments, an unknown tool
or a question without options get an error as that call's result, and the model tries again
within the bound; a reply with neither words nor a tool call is told so. Pure: the tools'
schemas, the argument checks and the request; the I/O is in activities/specialist_agent.py.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from parley.specialists import REASONS, RETURNS_PERSONA

# Model calls one specialist makes at most: enough for the items, two questions, the window
# check, the proposal and a few replies that had to be asked again.
AGENT_MAX_STEPS = 8
# The specialist's model calls are stored as the turn's steps from here on, apart from the
# turn's own (0, 1, ...).
AGENT_STEP_BASE = 100

LIST_ITEMS = "list_order_items"
CHECK_WINDOW = "check_return_window"
ASK_USER = "ask_user"
PROPOSE_RETURN = "propose_return"

ReasonValue = Literal["too_small", "too_large", "damaged", "changed_my_mind"]
assert {o.value for o in REASONS} == set(ReasonValue.__args__)  # type: ignore[attr-defined]


class _Args(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class OrderArgs(_Args):
    order_id: str = Field(pattern=r"^\d{3,10}$", description="The order number")


class AskOption(_Args):
    label: str = Field(min_length=1, max_length=80, description="What the customer sees")
    value: str = Field(min_length=1, max_length=80, description="What you get back")


class AskUserArgs(_Args):
    question: str = Field(min_length=1, max_length=300)
    options: list[AskOption] = Field(min_length=2, max_length=6)


class ProposeReturnArgs(OrderArgs):
    item_id: str = Field(min_length=1, max_length=40, description="An item_id of the order")
    reason: ReasonValue


@dataclass(frozen=True)
class AgentTool:
    args: type[_Args]
    description: str


AGENT_TOOLS: dict[str, AgentTool] = {
    LIST_ITEMS: AgentTool(OrderArgs, "The items of the order: item_id and name of each."),
    CHECK_WINDOW: AgentTool(OrderArgs, "Whether the order is still inside its return window."),
    ASK_USER: AgentTool(
        AskUserArgs,
        "Ask the customer one question with 2 to 6 options to click; the result is the "
        "value of the option they chose (null when their words named none).",
    ),
    PROPOSE_RETURN: AgentTool(
        ProposeReturnArgs,
        "Prepare the return of one item for the customer to confirm. They see a card and "
        "decide; the return is created only when they confirm. Your last step.",
    ),
}

AGENT_INSTRUCTIONS = (
    f"{RETURNS_PERSONA}\n"
    "Work through your tools, one call at a time: list the order's items, ask the customer "
    "which item (ask_user, the items as options) and why (ask_user, the reasons too_small, "
    "too_large, damaged, changed_my_mind as option values), check the return window, then "
    "propose_return. Never invent an item or a reason the customer did not choose. If the "
    "return is impossible (the window has closed), say so in one or two sentences without "
    "a tool call."
)

EMPTY_REPLY = (
    "Your last reply had neither words nor a tool call. Call one of your tools, or answer "
    "in words if there is nothing left to do."
)


def agent_tool_schemas() -> list[dict[str, Any]]:
    """The specialist's tools, provider-neutral (the gateway translates them)."""
    return [
        {"name": name, "description": tool.description, "parameters": tool.args.model_json_schema()}
        for name, tool in AGENT_TOOLS.items()
    ]


def check_call(name: str, arguments: Any) -> tuple[dict[str, Any] | None, str]:
    """The call's arguments as the tool takes them, or why they are refused (the error the
    model is shown as the call's result)."""
    tool = AGENT_TOOLS.get(name)
    if tool is None:
        return None, f"unknown tool {name!r}; your tools are {', '.join(AGENT_TOOLS)}"
    if isinstance(arguments, str):
        return None, "the arguments are not a JSON object; send them again as valid JSON"
    try:
        return tool.args.model_validate(arguments or {}).model_dump(), ""
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'arguments'}: {e['msg']}" for e in exc.errors()
        )
        return None, f"invalid arguments for {name}: {problems}"


@dataclass
class PastStep:
    """One earlier model call of the specialist: what it said and asked for, and the result
    of each call by its provider id (a call that did not run has none)."""

    text: str
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    results: dict[str, dict[str, Any]] = field(default_factory=dict)


def agent_messages(order_id: str, message: str, past: list[PastStep]) -> list[dict[str, Any]]:
    """The specialist's request: its instructions, the task, then its own steps so far.
    Every tool call gets a result (providers refuse a call without one): a refused call its
    error, one that was not run a note saying so."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": AGENT_INSTRUCTIONS},
        {
            "role": "user",
            "content": f"The customer wants to return something from order {order_id}. "
            f"Their message: {message}",
        },
    ]
    for step in past:
        if not step.tool_calls:  # an empty reply (one in words ended the loop): told so
            messages.append({"role": "user", "content": EMPTY_REPLY})
            continue
        messages.append({"role": "assistant", "content": step.text, "tool_calls": step.tool_calls})
        for call in step.tool_calls:
            result = step.results.get(call["id"])
            if result is None:
                _, problem = check_call(call["name"], call.get("arguments"))
                error = problem or "not run: one call at a time, after the one before it"
                result = {"error": error}
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": call["id"],
                    "content": json.dumps(result, sort_keys=True),
                }
            )
    return messages
