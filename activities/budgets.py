"""A model call held to its tenant's budgets (parley/costs.py, store/budgets.py): a turn's,
a specialist's step (activities/specialist_agent.py) and a summary run's
(activities/memory.py), each under the budgets of its tenant and user.

Before the call: its worst case (the prompt as stored, every token at the input price, and
the whole output reserve at the output price) is reserved against each budget it falls
under; a budget that cannot take it ends the turn with `budget_exhausted` before any model
is called (the step raises, non-retryable, like a paused tenant's), and skips a summary run
(its messages stay unfolded for a later pass). After the call, the ledger's billing settles
the reservation to the real cost (activities/ledger.py).

Counting fails open, as the daily message cap does: a store error while reserving is logged
and the call goes ahead. An exhausted budget fails closed.

The tenant's monthly budget refusing a turn's call asks its operator, once a month
(parley/budget_approvals.py): the approval is committed before the step fails, then its
workflow started (the sweep starts it if this worker dies in between, dispatch/budgets.py).
"""

from __future__ import annotations

import hashlib
import logging
from datetime import UTC, datetime
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError

from parley.budget_approvals import DEFAULT_APPROVAL_TIMEOUT_S, approval_id
from parley.costs import BudgetTake, budget_takes, price_table, tenant_prices, worst_case
from parley.dispatch.budgets import start_budget_approval
from parley.statuses import TurnErrorCode
from parley.store import budgets
from parley.store.db import Database, Db, StoreError
from parley.store.steps import CallRow, ForAttempt
from parley.tokens import count_messages, count_tools, default_counter

log = logging.getLogger(__name__)

BUDGET_EXHAUSTED_TEXT = "the budget for answers is used up for now"


async def hold_for_call(db: Db, call: CallRow, found: ForAttempt, *, sessions: Database) -> None:
    """Reserve the call's worst case against the budgets of the turn (`found`, as the step
    read it: its owner, its tenant's budgets and prices), or refuse the step (asking the
    tenant's operator when its month is used up)."""
    if not found.budgets or found.owner is None:
        return
    try:
        refused = await _reserve(db, call, found.owner, found.budgets, found.prices)
    except StoreError:
        log.warning("budget reservation failed for turn %s; going ahead", call.turn_id)
        return
    if refused:
        month = [t for t in refused if t.subject.startswith("tenant:") and t.period == "month"]
        if month:
            await ask_operator(db, found.owner[0], month[0], found.budgets, sessions=sessions)
        raise ApplicationError(
            f"{BUDGET_EXHAUSTED_TEXT} ({', '.join(t.key for t in refused)})",
            type=TurnErrorCode.budget_exhausted,
            non_retryable=True,
        )


async def _reserve(
    db: Db,
    call: CallRow,
    owner: tuple[str, str],
    config_budgets: dict[str, Any],
    prices: dict[str, Any] | None,
) -> list[BudgetTake]:
    return await reserve_worst_case(
        db,
        hold_id=call.id,
        owner=owner,
        config_budgets=config_budgets,
        prices=prices,
        provider=call.provider,
        model=call.model,
        request=call.request,
    )


def summary_hold_id(session_id: str, through: int) -> str:
    """A summary run's reservation: one per session and reach, as its ledger row (within the
    40 characters of a hold's call id)."""
    digest = hashlib.sha256(f"{session_id}:{through}".encode()).hexdigest()[:32]
    return f"sum_{digest}"


async def reserve_worst_case(
    db: Db,
    *,
    hold_id: str,
    owner: tuple[str, str],
    config_budgets: dict[str, Any],
    prices: dict[str, Any] | None,
    provider: str,
    model: str,
    request: dict[str, Any],
) -> list[BudgetTake]:
    """Reserve a model call's worst case (`request`: its messages, tools and output reserve)
    against the budgets of its tenant and user (`owner`), held as `hold_id`; the budgets that
    refused it (none: reserved, or held already by an earlier attempt)."""
    tenant_id, user_id = owner
    today = datetime.now(UTC).date()
    takes = budget_takes(config_budgets, tenant_id=tenant_id, user_id=user_id, today=today)
    if not takes:
        return []
    price = price_table().price(provider, model, on=today, overrides=tenant_prices(prices))
    counter = default_counter()
    prompt = count_messages(counter, request.get("messages", [])) + count_tools(
        counter, request.get("tools", [])
    )
    amount = worst_case(
        price,
        prompt_tokens=prompt,
        max_output_tokens=int(request.get("max_output_tokens", 1024)),
    )
    refused = await budgets.reserve(db, call_id=hold_id, takes=takes, amount=amount)
    return [t for t in takes if t.key in refused]


async def ask_operator(
    db: Db,
    tenant_id: str,
    month: BudgetTake,
    config_budgets: dict[str, Any],
    *,
    sessions: Database,
) -> None:
    """Ask the tenant's operator to approve going over its month (nothing when asked already
    this month): the approval committed, then its workflow started on this worker's task
    queue. A failure to start is logged; the sweep starts it."""
    timeout = config_budgets.get("approval_timeout_s") or DEFAULT_APPROVAL_TIMEOUT_S
    try:
        asked = await budgets.ask_approval(
            db,
            approval_id=approval_id(tenant_id=tenant_id, period_start=month.period_start),
            tenant_id=tenant_id,
            period_start=month.period_start,
            timeout_s=float(timeout),
        )
    except StoreError:
        log.warning("could not ask for a budget approval of tenant %s", tenant_id)
        return
    if asked is None:
        return
    try:
        queue = activity.info().task_queue
        await start_budget_approval(activity.client(), sessions, asked, task_queue=queue)
    except Exception:
        log.warning("budget approval %s not started now; the sweep starts it", asked.id)
