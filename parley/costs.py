"""What a model call costs: the price table, a tenant's overrides, and the cost of one call
from the usage its provider reported (or from Parley's own count, marked estimated).

The price table is a data file of the package (`prices.json`): dated tables, each applying
from its date until the next one's, of prices per million tokens for each
`provider/model` (`provider/*` prices any other model of that provider). A tenant's
`prices` (its configuration) override single models. Money is `Decimal` throughout: a float
cannot hold a cent of a sum of thousands of calls exactly.

Usage, as the gateway reports it (gateway/base.py `Finish.usage`):

    input_tokens        every prompt token, cached ones included (OpenAI's prompt_tokens;
                        Anthropic's input + cache reads + cache writes)
    cached_tokens       prompt tokens read from the provider's cache
    cache_write_tokens  prompt tokens written to it (Anthropic's cache_creation_input_tokens)
    output_tokens       the answer's tokens

    cost = (uncached * input + cached * cached_input + written * cache_write
            + output * output) / 1,000,000

The ledger (store/costs.py) keeps one row per model call with this cost; the budgets'
reservations (a worst case) are priced here too.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import date
from decimal import Decimal
from functools import cache
from importlib import resources
from typing import Any

from parley.tokens import count_messages, count_tools, default_counter

MILLION = Decimal(1_000_000)
ZERO = Decimal(0)


@dataclass(frozen=True)
class Price:
    """USD per million tokens. `cached_input` and `cache_write` default to `input` where a
    provider has no such discount or surcharge."""

    input: Decimal
    output: Decimal
    cached_input: Decimal | None = None
    cache_write: Decimal | None = None

    @classmethod
    def parse(cls, data: dict[str, Any]) -> Price:
        def money(key: str) -> Decimal | None:
            value = data.get(key)
            return None if value is None else Decimal(str(value))

        found_input, found_output = money("input"), money("output")
        if found_input is None or found_output is None:
            raise ValueError(f"a price needs input and output: {data}")
        return cls(found_input, found_output, money("cached_input"), money("cache_write"))


@dataclass(frozen=True)
class Usage:
    """A call's tokens as billed (see the module docstring), and whether they are Parley's
    own estimate because the provider reported none."""

    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    cache_write_tokens: int = 0
    estimated: bool = False

    @classmethod
    def reported(cls, usage: dict[str, Any] | None) -> Usage | None:
        """The provider's report, or None when it reported nothing."""
        if not usage or not (usage.get("input_tokens") or usage.get("output_tokens")):
            return None
        return cls(
            int(usage.get("input_tokens") or 0),
            int(usage.get("output_tokens") or 0),
            int(usage.get("cached_tokens") or 0),
            int(usage.get("cache_write_tokens") or 0),
        )

    @classmethod
    def estimate(
        cls, *, messages: list[dict[str, Any]], tools: list[dict[str, Any]], output: str
    ) -> Usage:
        """Parley's own count of a call the provider reported no usage for: the prompt as
        sent, and the text that streamed (a call cut short counts what it produced)."""
        counter = default_counter()
        prompt = count_messages(counter, messages) + count_tools(counter, tools)
        return cls(prompt, counter.count(output) if output else 0, estimated=True)

    @property
    def uncached_tokens(self) -> int:
        return max(self.input_tokens - self.cached_tokens - self.cache_write_tokens, 0)


def cost(price: Price, usage: Usage) -> Decimal:
    """The call's cost in USD, exact."""
    cached = price.cached_input if price.cached_input is not None else price.input
    written = price.cache_write if price.cache_write is not None else price.input
    total = (
        usage.uncached_tokens * price.input
        + usage.cached_tokens * cached
        + usage.cache_write_tokens * written
        + usage.output_tokens * price.output
    )
    return total / MILLION


@dataclass(frozen=True)
class PriceTable:
    """Dated tables of prices, oldest first: (from, {"provider/model": Price})."""

    tables: tuple[tuple[date, dict[str, Price]], ...]

    @classmethod
    def parse(cls, data: dict[str, Any]) -> PriceTable:
        tables = [
            (
                date.fromisoformat(t["from"]),
                {model: Price.parse(p) for model, p in t["models"].items()},
            )
            for t in data["tables"]
        ]
        return cls(tuple(sorted(tables, key=lambda t: t[0])))

    def price(
        self,
        provider: str,
        model: str,
        *,
        on: date,
        overrides: dict[str, Price] | None = None,
    ) -> Price | None:
        """The price of `provider/model` on a day: the tenant's override, else the table in
        force that day (its exact model, else its `provider/*`); None when unpriced."""
        key = f"{provider}/{model}"
        for prices in (overrides or {}, self._in_force(on)):
            for name in (key, f"{provider}/*"):
                if name in prices:
                    return prices[name]
        return None

    def _in_force(self, on: date) -> dict[str, Price]:
        current: dict[str, Price] = {}
        for since, prices in self.tables:
            if since <= on:
                current = prices
        return current


@cache
def price_table() -> PriceTable:
    """The package's price table (`prices.json`), read once."""
    text = resources.files("parley").joinpath("prices.json").read_text(encoding="utf-8")
    return PriceTable.parse(json.loads(text))


def tenant_prices(config_prices: dict[str, dict[str, Any]] | None) -> dict[str, Price]:
    """A tenant's `prices` (its configuration, `provider/model` → per-million strings)."""
    return {model: Price.parse(p) for model, p in (config_prices or {}).items()}


@dataclass(frozen=True)
class CallCost:
    """One model call's entry for the ledger."""

    provider: str
    model: str
    usage: Usage
    # None: no price is known for the model (the tokens are still kept).
    cost_usd: Decimal | None


def call_cost(
    *,
    provider: str,
    model: str,
    usage: Usage,
    on: date,
    overrides: dict[str, Price] | None = None,
) -> CallCost:
    price = price_table().price(provider, model, on=on, overrides=overrides)
    return CallCost(provider, model, usage, None if price is None else cost(price, usage))


# --- budgets ---------------------------------------------------------------------------------

# The share of a budget whose crossing leaves a notice, unless the tenant sets its own.
SOFT_SHARE = 0.8


@dataclass(frozen=True)
class BudgetTake:
    """One budget a model call reserves against: whose (`tenant:<t>`, `user:<t>/<u>`), its
    period ("day" | "month", UTC) and that period's first day, and its limit."""

    subject: str
    period: str
    period_start: date
    limit_usd: Decimal

    @property
    def key(self) -> str:
        return f"{self.subject} {self.period}"


def budget_takes(
    budgets: dict[str, Any] | None, *, tenant_id: str, user_id: str, today: date
) -> list[BudgetTake]:
    """The budgets a call of this user reserves against today, in one fixed order (every
    reservation locks its rows in it, so two turns never wait on each other crosswise)."""
    found = budgets or {}
    month = today.replace(day=1)
    user = f"user:{tenant_id}/{user_id}"
    wanted = [
        (f"tenant:{tenant_id}", "month", month, found.get("monthly_usd")),
        (user, "day", today, found.get("user_daily_usd")),
        (user, "month", month, found.get("user_monthly_usd")),
    ]
    takes = [BudgetTake(s, p, start, Decimal(str(v))) for s, p, start, v in wanted if v is not None]
    return sorted(takes, key=lambda t: (t.subject, t.period))


def soft_share(budgets: dict[str, Any] | None) -> Decimal:
    share = (budgets or {}).get("soft_share")
    return Decimal(str(share if share is not None else SOFT_SHARE))


def worst_case(price: Price | None, *, prompt_tokens: int, max_output_tokens: int) -> Decimal:
    """What a call can cost at most: every prompt token at the dearer of the input and the
    cache-write price, and the whole output reserve. Zero for an unpriced model (nothing to
    reserve: its calls are not held to a budget, and the ledger shows them unpriced)."""
    if price is None:
        return ZERO
    per_prompt_token = max(price.input, price.cache_write or price.input)
    return (prompt_tokens * per_prompt_token + max_output_tokens * price.output) / MILLION
