"""The tool registry: what the model may ask for, with argument schemas and risk classes.

The model only ever *asks*. Server code validates the arguments against these schemas,
takes identity from the session (no tool has a customer argument), and decides by risk:

- `read` runs at once (independent reads run in parallel);
- `proposal` only records a pending action for the user to confirm, it never sends;
- `write` runs only from the workflow after the user's own bound confirmation, and is not
  offered to the model at all;
- `handoff` records an escalation to a person.
"""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError


class Risk(StrEnum):
    read = "read"
    proposal = "proposal"
    write = "write"
    handoff = "handoff"


class _Args(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


OrderId = Field(pattern=r"^\d{3,10}$", description="Order number")


class NoArgs(_Args):
    pass


class OrderArgs(_Args):
    order_id: str = OrderId


EmailTemplate = Literal["order_status_summary", "refund_status", "return_instructions"]


class ProposeEmailArgs(_Args):
    order_id: str = OrderId
    template: EmailTemplate


class SendEmailArgs(_Args):
    action_id: str


class HandoffArgs(_Args):
    reason: str = Field(min_length=1, max_length=500)


class _OptionalArgs(_Args):
    """Arguments that may all be left out, shown to the model without null branches, titles
    or null defaults: the same contract in fewer prompt tokens on every turn."""

    @classmethod
    def model_json_schema(cls, *args: Any, **kwargs: Any) -> dict[str, Any]:
        schema = super().model_json_schema(*args, **kwargs)
        for prop in schema.get("properties", {}).values():
            prop.pop("title", None)
            branches = [b for b in prop.pop("anyOf", []) if b.get("type") != "null"]
            prop.update(branches[0] if branches else {})
            if prop.get("default", 0) is None:
                del prop["default"]
        return schema


IsoDate = Field(default=None, pattern=r"^\d{4}-\d{2}-\d{2}$")


class SearchOrdersArgs(_OptionalArgs):
    placed_from: str | None = IsoDate
    placed_to: str | None = IsoDate
    min_total: float | None = Field(default=None, ge=0, description="strictly over, USD")
    status: Literal["processing", "shipped", "delivered", "cancelled"] | None = None


class ProposeOrdersCsvArgs(_OptionalArgs):
    result_set_id: str = Field(pattern=r"^rs_[0-9a-f]{6,40}$")


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str
    args: type[_Args]
    risk: Risk
    label: str  # what the user sees while it runs
    backend: str = "northwind"

    def schema(self) -> dict[str, Any]:
        """The provider-neutral tool definition given to the model."""
        parameters = self.args.model_json_schema()
        parameters.pop("title", None)
        # Pydantic's per-field titles repeat the field names: tokens on every call, no meaning.
        for field_schema in parameters.get("properties", {}).values():
            field_schema.pop("title", None)
        return {"name": self.name, "description": self.description, "parameters": parameters}


TOOLS: dict[str, ToolSpec] = {
    spec.name: spec
    for spec in (
        ToolSpec(
            "list_open_orders",
            "List the signed-in customer's orders that are not yet delivered.",
            NoArgs,
            Risk.read,
            "Looking up your orders…",
        ),
        ToolSpec(
            "get_order",
            "Get one of the customer's orders: status, shipping and delivery dates, items.",
            OrderArgs,
            Risk.read,
            "Looking up the order…",
        ),
        ToolSpec(
            "get_refund",
            "Get the refund of one of the customer's orders: amount, status, dates.",
            OrderArgs,
            Risk.read,
            "Checking the refund…",
        ),
        ToolSpec(
            "check_return_eligibility",
            "Check whether an order can still be returned and how many days are left.",
            OrderArgs,
            Risk.read,
            "Checking the return window…",
        ),
        ToolSpec(
            "propose_email",
            "Prepare an email to the customer's verified address on file, from a template. "
            "Nothing is sent until the customer confirms.",
            ProposeEmailArgs,
            Risk.proposal,
            "Preparing the email…",
        ),
        ToolSpec(
            "send_email",
            "Send a confirmed email. Called only by the server after confirmation.",
            SendEmailArgs,
            Risk.write,
            "Sending the email…",
        ),
        ToolSpec(
            "search_orders",
            "Search the customer's orders by placed date (inclusive range), total and status; "
            "the result is kept as a result set.",
            SearchOrdersArgs,
            Risk.read,
            "Searching your orders…",
        ),
        ToolSpec(
            "propose_orders_csv",
            "Prepare an email of one result set as orders.csv to the customer's verified "
            "address. Nothing is sent until the customer confirms.",
            ProposeOrdersCsvArgs,
            Risk.proposal,
            "Preparing the export…",
        ),
        ToolSpec(
            "delegate_returns",
            "Hand a return of one of the customer's orders to the Returns specialist, who asks "
            "the customer which item and why and prepares the return for them to confirm.",
            OrderArgs,
            Risk.handoff,
            "Getting the Returns specialist…",
            backend="parley",
        ),
        ToolSpec(
            "create_return",
            "Create a confirmed return. Called only by the server after confirmation.",
            SendEmailArgs,
            Risk.write,
            "Creating the return…",
        ),
        ToolSpec(
            "handoff_to_human",
            "Hand the conversation to a person on the support team.",
            HandoffArgs,
            Risk.handoff,
            "Getting a person to help…",
            backend="parley",
        ),
    )
}


def model_tools() -> list[dict[str, Any]]:
    """Tools offered to the model: everything but writes, in a stable order (cache-friendly).
    The schemas are built once (pydantic's schema generation is not cheap, and every context
    build asks) and shared, not copied: a new list of the same dicts, which callers read and
    store, never change."""
    return list(_model_tools())


@functools.cache
def _model_tools() -> list[dict[str, Any]]:
    return [spec.schema() for spec in TOOLS.values() if spec.risk != Risk.write]


def risk_of(name: str) -> Risk | None:
    spec = TOOLS.get(name)
    return spec.risk if spec else None


def args_hash(name: str, arguments: dict[str, Any]) -> str:
    canonical = json.dumps({"tool": name, "args": arguments}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


@dataclass(frozen=True)
class ToolError:
    """A structured error the model receives instead of a result."""

    code: str  # unknown_tool | invalid_arguments | not_found | unavailable | refused | ...
    message: str
    retryable: bool = False

    def as_result(self) -> dict[str, Any]:
        return {"error": {"code": self.code, "message": self.message, "retryable": self.retryable}}


def parse_arguments(name: str, raw: str | dict[str, Any]) -> _Args | ToolError:
    """Validate a model's tool call; anything off is a ToolError, never an exception."""
    spec = TOOLS.get(name)
    if spec is None:
        return ToolError("unknown_tool", f"there is no tool named {name!r}")
    if spec.risk == Risk.write:
        return ToolError("refused", f"{name} runs only after the customer confirms")
    if isinstance(raw, str):
        try:
            raw = json.loads(raw or "{}")
        except json.JSONDecodeError as exc:
            return ToolError("invalid_arguments", f"arguments are not valid JSON: {exc.msg}")
    if not isinstance(raw, dict):
        return ToolError("invalid_arguments", "arguments must be a JSON object")
    try:
        return spec.args.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'arguments'}: {e['msg']}" for e in exc.errors()
        )
        return ToolError("invalid_arguments", problems)
