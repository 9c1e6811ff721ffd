"""The price of a model call: the dated table, a tenant's override, cached tokens and cache
writes, and Parley's own estimate when a provider reports no usage."""

from __future__ import annotations

from datetime import date
from decimal import Decimal

import pytest
from pydantic import ValidationError

from parley.costs import Price, PriceTable, Usage, call_cost, cost, price_table, tenant_prices
from parley.tenancy import TenantConfig

DAY = date(2026, 12, 6)


def test_cached_tokens_are_billed_at_the_cached_price_and_the_rest_at_the_input_price() -> None:
    price = Price(input=Decimal("2.50"), output=Decimal("10.00"), cached_input=Decimal("1.25"))
    usage = Usage(input_tokens=1000, output_tokens=200, cached_tokens=400)
    # 600 uncached, 400 cached, 200 out: (1500 + 500 + 2000) / 1e6
    assert cost(price, usage) == Decimal("0.004")


def test_anthropic_cache_writes_cost_more_and_reads_less_than_plain_input() -> None:
    sonnet = price_table().price("anthropic", "claude-sonnet-4-5", on=DAY)
    assert sonnet is not None
    plain = cost(sonnet, Usage(input_tokens=2000, output_tokens=100))
    written = cost(sonnet, Usage(input_tokens=2000, output_tokens=100, cache_write_tokens=1500))
    read = cost(sonnet, Usage(input_tokens=2000, output_tokens=100, cached_tokens=1500))
    assert read < plain < written
    assert written - plain == 1500 * (Decimal("3.75") - Decimal("3.00")) / 1_000_000


def test_the_table_in_force_on_the_calls_day_prices_it() -> None:
    table = PriceTable.parse(
        {
            "tables": [
                {"from": "2026-01-01", "models": {"openai/m": {"input": "1", "output": "2"}}},
                {"from": "2026-07-01", "models": {"openai/m": {"input": "3", "output": "4"}}},
            ]
        }
    )
    assert table.price("openai", "m", on=date(2026, 6, 30)) == Price(Decimal(1), Decimal(2))
    assert table.price("openai", "m", on=date(2026, 7, 1)) == Price(Decimal(3), Decimal(4))
    assert table.price("openai", "m", on=date(2025, 12, 31)) is None
    assert table.price("openai", "other", on=DAY) is None


def test_a_tenants_price_overrides_the_table_and_an_unknown_model_stays_unpriced() -> None:
    config = TenantConfig.model_validate(
        {"prices": {"openai/gpt-4o": {"input": "1.00", "output": "2.00"}}}
    )
    overrides = tenant_prices(
        {k: v.model_dump(exclude_none=True) for k, v in (config.prices or {}).items()}
    )
    usage = Usage(input_tokens=1_000_000, output_tokens=1_000_000)
    own = call_cost(provider="openai", model="gpt-4o", usage=usage, on=DAY, overrides=overrides)
    listed = call_cost(provider="openai", model="gpt-4o", usage=usage, on=DAY)
    assert own.cost_usd == Decimal("3.00")
    assert listed.cost_usd == Decimal("12.50")
    unknown = call_cost(provider="openai", model="no-such-model", usage=usage, on=DAY)
    assert unknown.cost_usd is None


def test_a_price_is_a_decimal_string_never_a_float() -> None:
    with pytest.raises(ValidationError):
        TenantConfig.model_validate({"prices": {"openai/gpt-4o": {"input": 1.5, "output": "2"}}})
    with pytest.raises(ValidationError):
        TenantConfig.model_validate({"prices": {"openai/gpt-4o": {"input": "-1", "output": "2"}}})


def test_no_reported_usage_is_estimated_from_the_prompt_and_what_streamed() -> None:
    assert Usage.reported({}) is None
    assert Usage.reported({"input_tokens": 0, "output_tokens": 0}) is None
    estimate = Usage.estimate(
        messages=[{"role": "user", "content": "Where is my order?"}], tools=[], output="On its way"
    )
    assert estimate.estimated
    assert estimate.input_tokens > 0 and estimate.output_tokens > 0


def test_the_bench_prices_the_standing_prompt_cheaper_with_the_cache() -> None:
    from bench.prompt_cache import measure_prompt_cache, render_prompt_cache

    figures = measure_prompt_cache()
    assert figures["cached"] and figures["prefix_tokens"] >= figures["minimum"]
    assert Decimal(figures["cached_usd"]) < Decimal(figures["uncached_usd"])
    assert "saved" in render_prompt_cache(figures)
