"""(s) What Anthropic's prompt cache saves on Parley's standing prompt: the tokens of a
tenant's cached prefix (Anthropic's tool-use system prompt, the tool schemas, the
instructions up to the `cache_control` breakpoint: gateway/anthropic.py), whether it reaches
the model's minimum, and what a conversation's turns cost with and without the cache at the
package's prices (parley/costs.py). Arithmetic on the real prompt, no model run; the system
test `tests/system/test_costs.py` shows the same reads priced in the ledger.

    python -m bench.prompt_cache
"""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from parley.activities.tool_offer import tenant_tools
from parley.config import Settings
from parley.context import STANDING_RULES
from parley.costs import Usage, cost, price_table
from parley.gateway.fake_provider.server import anthropic_cache_min
from parley.tenancy import TenantConfig
from parley.tokens import count_tools, default_counter

MODEL = "claude-sonnet-4-5"
TURNS = 10
# Each turn's prompt beyond the standing prompt (conversation, state, the message) and its
# answer, in tokens: a short support conversation's.
CONVERSATION_TOKENS = 700
OUTPUT_TOKENS = 90
TOOL_USE_PROMPT = 346  # Anthropic's own system prompt for a request with tools (auto)
# A tenant with tools and a brand voice of a few sentences.
PERSONA = (
    "You are the assistant of Northwind Outfitters. Speak plainly and warmly, in short "
    "sentences. Never promise a refund, a delivery date or an exception the tools have not "
    "confirmed. Say what went wrong first, then what happens next and when. "
) * 4


def measure_prompt_cache() -> dict[str, Any]:
    counter = default_counter()
    settings = Settings()
    tenant = TenantConfig(persona=PERSONA, specialists=True)
    tools = tenant_tools(tenant)
    instructions = f"{settings.system_prompt}\n\n{tenant.persona}\n\n{STANDING_RULES}"
    prefix = TOOL_USE_PROMPT + count_tools(counter, tools) + counter.count(instructions)
    minimum = anthropic_cache_min(MODEL)
    price = price_table().price("anthropic", MODEL, on=datetime.now(UTC).date())
    assert price is not None
    prompt = prefix + CONVERSATION_TOKENS
    cached = prefix >= minimum
    plain = cost(price, Usage(prompt, OUTPUT_TOKENS)) * TURNS
    written = Usage(prompt, OUTPUT_TOKENS, cache_write_tokens=prefix if cached else 0)
    read = Usage(prompt, OUTPUT_TOKENS, cached_tokens=prefix if cached else 0)
    with_cache = cost(price, written) + cost(price, read) * (TURNS - 1)
    return {
        "model": MODEL,
        "tools": len(tools),
        "prefix_tokens": prefix,
        "minimum": minimum,
        "cached": cached,
        "turns": TURNS,
        "uncached_usd": str(plain),
        "cached_usd": str(with_cache),
        "saving_share": float((plain - with_cache) / plain) if plain else 0.0,
    }


def render_prompt_cache(r: dict[str, Any]) -> str:
    usd = Decimal
    return "\n".join(
        [
            f"(s) Anthropic prompt cache, {r['model']}, a tenant with {r['tools']} tools",
            f"  cached prefix {r['prefix_tokens']} tokens (minimum {r['minimum']}): "
            + ("cached" if r["cached"] else "below the minimum, not cached"),
            f"  {r['turns']} turns: {usd(r['uncached_usd']):.4f} USD without the cache, "
            f"{usd(r['cached_usd']):.4f} USD with it ({r['saving_share']:.0%} saved)",
        ]
    )


if __name__ == "__main__":
    print(render_prompt_cache(measure_prompt_cache()))
