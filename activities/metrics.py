"""Worker-side Prometheus metrics (served by the worker on PARLEY_WORKER_METRICS_PORT)."""

from __future__ import annotations

from prometheus_client import Counter

MODEL_CALLS = Counter(
    "parley_model_calls_total",
    "Model calls by provider, model and outcome",
    ["provider", "model", "outcome"],
)
MODEL_TOKENS = Counter(
    "parley_model_tokens_total",
    "Tokens as the provider reported them",
    ["provider", "model", "kind"],
)
# The ledger's cost (store/costs.py) in USD, by provider, model and kind of call ("turn",
# "summary", "specialist"): moved once per ledger row, by the write that made it.
MODEL_COST = Counter(
    "parley_model_cost_usd_total",
    "Model calls' cost in USD as the ledger priced it, by provider, model and kind",
    ["provider", "model", "kind"],
)
# Budgets whose soft share was crossed (a notice written: store/budgets.py), by period.
BUDGET_NOTICES = Counter(
    "parley_budget_notices_total",
    "Budgets that passed their soft share in a period (a notice written), by period",
    ["period"],
)

# What recall did for each prompt a context build packed: "skipped" (the window held the whole
# conversation: no search, no embedding), "fts" (full-text search) or "hybrid" (full-text
# fused with the nearest in meaning: the question was embedded).
RECALLS = Counter(
    "parley_context_recall_total",
    "Context builds by what recall did (skipped, fts, hybrid)",
    ["method"],
)

# Summary versions written, by whose lines they hold: "model" (the first answer was usable),
# "repaired" (the one repair attempt was), "fallback" (the code summarizer's, parley/fold.py),
# "fallback_unasked" (the code's, the model not asked: it failed on the latest versions).
SUMMARIES = Counter(
    "parley_summaries_total",
    "Rolling summary versions written, by provider, model and who wrote the lines",
    ["provider", "model", "outcome"],
)


def record_usage(provider: str, model: str, usage: dict[str, int]) -> None:
    MODEL_CALLS.labels(provider, model, "ok").inc()
    for kind in ("input_tokens", "output_tokens", "cached_tokens"):
        if usage.get(kind):
            MODEL_TOKENS.labels(provider, model, kind.removesuffix("_tokens")).inc(usage[kind])


# Hand-offs to a person opened, by what opened them ("tool": the model's handoff_to_human).
HANDOFFS_OPENED = Counter(
    "parley_handoffs_opened_total", "Hand-offs to a person opened, by what opened them", ["by"]
)

# Rows the retention purge deleted, by table (workflows/retention.py).
RETENTION_PURGED = Counter(
    "parley_retention_rows_purged_total",
    "Rows the retention purge deleted, by table",
    ["table"],
)
