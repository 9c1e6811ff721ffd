"""A turn's model call held to its tenant's budgets (parley/costs.py, store/budgets.py).

Before the call: its worst case (the prompt as stored, every token at the input price, and
the whole output reserve at the output price) is reserved against each budget it falls
under; a budget that cannot take it ends the turn with `budget_exhausted` before any model
is called (the step raises, non-retryable, like a paused tenant's). After the call, the
ledger's billing settles the reservation to the real cost (activities/ledger.py).

Counting fails open, as the daily message cap does: a store error while reserving is logged
and the call goes ahead. An exhausted budget fails closed.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

from temporalio.exceptions import ApplicationError

from parley.costs import budget_takes, price_table, tenant_prices, worst_case
from parley.statuses import TurnErrorCode
from parley.store import budgets
from parley.store.db import Db, StoreError
from parley.store.steps import CallRow, ForAttempt
from parley.tokens import count_messages, count_tools, default_counter

log = logging.getLogger(__name__)

BUDGET_EXHAUSTED_TEXT = "the budget for answers is used up for now"


async def hold_for_call(db: Db, call: CallRow, found: ForAttempt) -> None:
    """Reserve the call's worst case against the budgets of the turn (`found`, as the step
    read it: its owner, its tenant's budgets and prices), or refuse the step."""
    if not found.budgets or found.owner is None:
        return
    try:
        refused = await _reserve(db, call, found.owner, found.budgets, found.prices)
    except StoreError:
        log.warning("budget reservation failed for turn %s; going ahead", call.turn_id)
        return
    if refused:
        raise ApplicationError(
            f"{BUDGET_EXHAUSTED_TEXT} ({', '.join(refused)})",
            type=TurnErrorCode.budget_exhausted,
            non_retryable=True,
        )


async def _reserve(
    db: Db,
    call: CallRow,
    owner: tuple[str, str],
    config_budgets: dict[str, Any],
    prices: dict[str, Any] | None,
) -> list[str]:
    tenant_id, user_id = owner
    today = datetime.now(UTC).date()
    takes = budget_takes(config_budgets, tenant_id=tenant_id, user_id=user_id, today=today)
    if not takes:
        return []
    price = price_table().price(
        call.provider, call.model, on=today, overrides=tenant_prices(prices)
    )
    counter = default_counter()
    prompt = count_messages(counter, call.request.get("messages", [])) + count_tools(
        counter, call.request.get("tools", [])
    )
    amount = worst_case(
        price,
        prompt_tokens=prompt,
        max_output_tokens=int(call.request.get("max_output_tokens", 1024)),
    )
    return await budgets.reserve(db, call_id=call.id, takes=takes, amount=amount)
