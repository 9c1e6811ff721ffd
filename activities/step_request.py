"""A step's request as the context build stores it: the blocks packed to the model's window
(parley/context.py decides what fits), and the request the model is sent with what packing it
cost, as the stored model call keeps it (activities/context.py builds both)."""

from __future__ import annotations

from typing import Any

from temporalio.exceptions import ApplicationError

from parley.context import Block, Packed, Share, input_budget, pack
from parley.errors import ContextTooLarge
from parley.ids import prompt_cache_key
from parley.paths import AnswerPath, effort_for
from parley.prompt import CONVERSATION_KINDS, Budgets, describe, stable_prefix
from parley.redaction import redact_messages
from parley.tenancy import TenantConfig
from parley.tokens import TokenCounter, count_message


def pack_blocks(
    blocks: list[Block], budgets: Budgets, counter: TokenCounter, *, left_out: list[str]
) -> Packed:
    """Pack to the model's window minus the output reserve, the conversation's blocks within
    the conversation budget; a required block that cannot fit fails the turn (not retried:
    the same conversation would not fit the next time either)."""
    budget = input_budget(window=budgets.window, reserve=budgets.reserve, exact=counter.exact)
    try:
        return pack(
            blocks,
            budget=budget,
            count_note=lambda note: count_message(counter, {"role": "system", "content": note}),
            share=Share(CONVERSATION_KINDS, budgets.conversation),
            left_out=left_out,
        )
    except ContextTooLarge as exc:
        raise ApplicationError(exc.message, type=exc.code, non_retryable=True) from None


def stored_request(
    packed: Packed,
    plan: dict[str, Any],
    tools: list[dict[str, Any]],
    budgets: Budgets,
    counter: TokenCounter,
    path: AnswerPath,
    tenant: TenantConfig,
    withheld: dict[str, str],
    reanswer_of: str | None,
) -> dict[str, Any]:
    """The stored request of a step: what the model is sent (masked where the tenant asks,
    parley/redaction.py), and what packing it cost."""
    messages = redact_messages(packed.messages) if tenant.redact_model_input else packed.messages
    return {
        "messages": messages,
        "tools": tools,
        "max_output_tokens": budgets.reserve,
        "reasoning_effort": effort_for(path, tenant.reasoning_effort),
        "path": path.value,
        "reanswer_of": reanswer_of,
        "cache_key": prompt_cache_key(stable_prefix=stable_prefix(messages, tools)),
        "budget": {
            "window": budgets.window,
            "reserve": budgets.reserve,
            "input_budget": packed.budget,
            "prompt_tokens": packed.used,
            "counter": counter.name,
            "blocks": describe(packed.kept),
            "dropped": packed.missing,
            "tools_withheld": withheld,
            **plan,
        },
    }
