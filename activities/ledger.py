"""Billing a model call: its cost priced (parley/costs.py) and written to the ledger once
(store/costs.py), and the cost counter moved by the attempt that wrote the row.

Called by every activity that calls a model, right after the call's outcome is stored; the
call-model activity calls it again when a retry finds the outcome stored (the attempt that
stored it may have died before billing), which writes nothing when the row is there.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

from parley.activities.metrics import BUDGET_NOTICES, MODEL_COST
from parley.costs import ZERO, CallCost, Usage, call_cost, soft_share, tenant_prices
from parley.store import budgets as budget_store
from parley.store import costs
from parley.store.db import Db
from parley.store.steps import CallRow

log = logging.getLogger(__name__)


def priced(
    *,
    provider: str,
    model: str,
    usage: dict[str, Any] | None,
    prompt: dict[str, Any],
    output: str,
    prices: dict[str, Any] | None,
) -> CallCost:
    """The call's ledger entry: the provider's usage, else Parley's estimate of the prompt
    as sent (`prompt`: the stored request's messages and tools) and what streamed."""
    counted = Usage.reported(usage) or Usage.estimate(
        messages=prompt.get("messages", []), tools=prompt.get("tools", []), output=output
    )
    today = datetime.now(UTC).date()
    return call_cost(
        provider=provider, model=model, usage=counted, on=today, overrides=tenant_prices(prices)
    )


def priced_call(call: CallRow, prices: dict[str, Any] | None) -> CallCost:
    """A turn's model call's ledger entry, from its stored row (its outcome written)."""
    return priced(
        provider=call.provider,
        model=call.model,
        usage=call.usage,
        prompt=call.request,
        output=call.response_text or "",
        prices=prices,
    )


def bill_params(call: CallRow, entry: CallCost, kind: costs.Kind = "turn") -> dict[str, Any]:
    """The ledger row's parameters, for the statement that stores the call's outcome."""
    key = costs.call_key(call.id)
    return costs.ledger_params(key=key, kind=kind, turn_id=call.turn_id, entry=entry)


async def bill_call(
    db: Db,
    call: CallRow,
    *,
    prices: dict[str, Any] | None,
    budgets: dict[str, Any] | None = None,
    kind: costs.Kind = "turn",
) -> None:
    """Write a turn's model call (its outcome stored) to the ledger, unless it is there, and
    settle its budget reservation (a retry that finds the outcome stored; the specialist's
    steps). The resolver's question is code's answer stored as a step, no model call."""
    if call.provider == "resolver":
        return
    entry = priced_call(call, prices)
    key = costs.call_key(call.id)
    if await costs.record_turn_call(db, key=key, turn_id=call.turn_id, kind=kind, entry=entry):
        count(entry, kind)
    await settle(db, call.id, entry, budgets)


async def settle(
    db: Db, hold_id: str, entry: CallCost | None, budgets: dict[str, Any] | None
) -> None:
    """Settle a call's budget reservation (`hold_id`: the turn's or specialist's model call,
    a summary run's hold) to its real cost, nothing for a call never made (`entry` None);
    `budgets`: the tenant's configuration. Nothing moves when it ran already, or reserved
    nothing."""
    if not budgets:
        return
    cost = entry.cost_usd if entry is not None and entry.cost_usd is not None else ZERO
    crossed = await budget_store.settle(
        db, call_id=hold_id, cost=cost, soft_share=soft_share(budgets)
    )
    for budget in crossed:
        BUDGET_NOTICES.labels(budget.period).inc()
        log.info(
            "budget %s %s from %s passed its soft share: %s of %s USD",
            budget.subject,
            budget.period,
            budget.period_start,
            budget.spent_usd,
            budget.limit_usd,
        )


async def bill_dropped(
    db: Db,
    call: CallRow,
    *,
    provider: str,
    model: str,
    usage: dict[str, int] | None,
    prices: dict[str, Any] | None,
) -> None:
    """An attempt of a turn's call whose stream broke after the provider reported usage for
    it (Anthropic's `message_start`): billed on its own row, once per attempt, as the
    provider bills it. Nothing when it reported none (Parley's estimate is for the call
    that answers). The budgets hold the answering attempt's cost only."""
    if Usage.reported(usage) is None:
        return
    entry = priced(provider=provider, model=model, usage=usage, prompt={}, output="", prices=prices)
    key = costs.dropped_key(call.id, call.attempts)
    if await costs.record_turn_call(db, key=key, turn_id=call.turn_id, kind="turn", entry=entry):
        count(entry, "turn")


def count(entry: CallCost, kind: str) -> None:
    """The cost counter, moved once per ledger row (by the write that made it)."""
    if entry.cost_usd is not None:
        MODEL_COST.labels(entry.provider, entry.model, kind).inc(float(entry.cost_usd))
