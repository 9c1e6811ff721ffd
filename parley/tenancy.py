"""Per-tenant configuration: what an operator may change for one tenant, over code defaults.

Validated here, stored as JSON on the tenant row, read by the context builder (model,
window, persona, tools) and the session API (daily cap). Credentials are never part of it:
they come from the environment only.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from parley.handoff_rules import HandoffRules
from parley.mcp import McpServerConfig, find_tool, is_mcp_name
from parley.oidc import OidcConfig
from parley.retention import RetentionPeriods
from parley.skills import RUN_SKILL
from parley.specialists import DELEGATION_TOOLS
from parley.tools import TOOLS, Risk
from parley.webhooks import HandoffWebhookConfig
from parley.wire import IntOrNone

# The local tools an allow-list may name: all but the writes, which only a user's confirm
# runs. The OpenAPI document lists them; `PUT .../config` refuses any other name.
LOCAL_TOOLS = sorted(name for name, spec in TOOLS.items() if spec.risk != Risk.write)
LocalTool = Annotated[str, Field(json_schema_extra={"enum": LOCAL_TOOLS})]
# An origin as a browser sends it: scheme, lower-case host, a port only when not the default.
WebOrigin = Annotated[str, Field(pattern=r"^https?://[a-z0-9.\-]+(:[0-9]{1,5})?$", max_length=300)]
# USD per million tokens, as a decimal string ("2.50"): money is never a float.
Money = Annotated[str, Field(pattern=r"^\d{1,6}(\.\d{1,6})?$")]


class ModelPrice(BaseModel):
    """A tenant's price for one model, over the package's table (parley/costs.py)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    input: Money
    output: Money
    cached_input: Money | None = None
    cache_write: Money | None = None


class BudgetConfig(BaseModel):
    """What a tenant's turns may spend on model calls, in USD (parley/costs.py): the tenant's
    month, each user's day and month (UTC). Unset: no such budget."""

    model_config = ConfigDict(extra="forbid", strict=True)

    monthly_usd: Money | None = None
    user_daily_usd: Money | None = None
    user_monthly_usd: Money | None = None
    # The share of a budget whose crossing leaves a notice, once per period (0.8 unset).
    soft_share: float | None = Field(default=None, gt=0.0, le=1.0)
    # How long an operator has to approve going over the monthly budget once it is used up
    # (parley/budget_approvals.py); None: a day.
    approval_timeout_s: float | None = Field(default=None, ge=1.0, le=31 * 24 * 3600.0)


class TenantConfig(BaseModel):
    # Strict: the contract's types exactly (`false` is no day count, `"5"` no cap, `1` no
    # switch), as a stored config is read back.
    model_config = ConfigDict(extra="forbid", strict=True)

    # Added to the standing instructions, e.g. a brand voice.
    persona: str | None = Field(default=None, max_length=2000)
    model_provider: Literal["demo", "openai", "anthropic"] | None = None
    model: str | None = Field(default=None, max_length=100)
    # The model's context window in tokens; the prompt gets this minus the output reserve.
    context_window_tokens: IntOrNone = Field(default=None, ge=1024, le=2_000_000)
    # Tokens kept free for the answer.
    output_reserve_tokens: IntOrNone = Field(default=None, ge=64, le=32000)
    # Tokens for the conversation context: pinned facts, summary, recalled and recent turns.
    # (The floor: the budget follows the conversation, `context_conversation_share` of its
    # distinct text, up to `context_conversation_max_tokens`; parley/budget.py.)
    context_conversation_tokens: IntOrNone = Field(default=None, ge=300, le=1_000_000)
    context_conversation_share: float | None = Field(default=None, ge=0.0, le=1.0)
    context_conversation_max_tokens: IntOrNone = Field(default=None, ge=300, le=1_000_000)
    # Whether older turns are folded into a rolling summary after each turn.
    summaries: bool | None = None
    reasoning_effort: Literal["low", "medium", "high"] | None = None
    # Tools the model is offered; None offers all of them.
    # The enum documents what the route checks (a stored name a later release drops must
    # still read back, so the model itself does not refuse it).
    tool_allowlist: list[LocalTool] | None = None
    # User messages accepted per tenant per UTC day; None is unlimited.
    daily_cap: IntOrNone = Field(default=None, ge=0)
    # User messages accepted per user of this tenant per UTC day; None: the deployment's
    # `PARLEY_USER_DAILY_MESSAGES`.
    user_daily_cap: IntOrNone = Field(default=None, ge=0)
    # Over the deployment's `PARLEY_MAX_ACTIVE_TURNS_PER_USER` and
    # `PARLEY_USER_REQUESTS_PER_MINUTE` for this tenant's users.
    max_active_turns_per_user: IntOrNone = Field(default=None, ge=1, le=100)
    user_requests_per_minute: IntOrNone = Field(default=None, ge=1, le=10_000)
    # Tool servers over the Model Context Protocol (parley/mcp.py): each with its own
    # allow-list and risk classes; `tool_allowlist` is about the local tools only.
    mcp_servers: list[McpServerConfig] | None = Field(default=None, max_length=10)
    # Skills of the catalog this tenant's turns may run in a sandbox (parley/skills.py);
    # None or empty: no `run_skill` tool is offered.
    skills: list[str] | None = Field(default=None, max_length=20)
    # Seconds a hand-off to a person waits for an agent's claim before the customer is told
    # (parley/handoffs.py); None: the deployment's `PARLEY_HANDOFF_CLAIM_TIMEOUT_S` (its
    # default: parley/config.py `DEFAULT_CLAIM_TIMEOUT_S`).
    handoff_claim_timeout_s: float | None = Field(default=None, ge=1, le=7 * 24 * 3600)
    # Hand-offs code opens (the customer asking for a person, repeated outages or
    # retractions), cases' priorities (parley/handoff_rules.py); None: the defaults there.
    handoff_rules: HandoffRules | None = None
    # Where the team's own tools hear of hand-offs (parley/webhooks.py); None: nowhere.
    handoff_webhook: HandoffWebhookConfig | None = None
    # Whether the model may hand work to a specialist (parley/specialists.py); off unless set.
    specialists: bool | None = None
    # Mask card numbers and email addresses in everything sent to a model provider (the
    # turns' prompts and the summarizer's; parley/redaction.py); the stored text is unchanged.
    redact_model_input: bool | None = None
    # Seconds before a confirmation card lapses that its `confirmation_expiring` warning is
    # shown; None: the deployment's `PARLEY_CONFIRMATION_WARNING_S`, 0: no warning.
    confirmation_warning_s: float | None = Field(default=None, ge=0.0, le=86_400.0)
    # How long this tenant keeps messages, prompts and traces, summaries and memory items
    # (parley/retention.py); unset periods are the deployment's `PARLEY_RETENTION_*_DAYS`.
    retention: RetentionPeriods | None = None
    # Sign-in through the tenant's own identity provider (parley/oidc.py); None: only
    # Parley's own tokens.
    oidc: OidcConfig | None = None
    # Web origins (`https://app.example.com`) whose pages may call the API with this
    # tenant's tokens (api/cors.py); None or empty: no cross-origin page may.
    cors_origins: list[WebOrigin] | None = Field(default=None, max_length=20)
    # Prices per `provider/model` over the package's table (a negotiated rate, a model the
    # table does not know); the ledger prices this tenant's calls with them.
    prices: dict[str, ModelPrice] | None = Field(default=None, max_length=50)
    # Budgets in money; a turn at a budget's edge ends with `budget_exhausted` before its
    # model call (activities/budgets.py).
    budgets: BudgetConfig | None = None

    @model_validator(mode="after")
    def _no_nul(self) -> TenantConfig:
        # Stored as JSONB, which cannot hold NUL: refused here (422), not on insert (500).
        if _holds_nul(self.model_dump()):
            raise ValueError("text must not contain NUL characters")
        return self

    def handoffs(self) -> HandoffRules:
        return self.handoff_rules or HandoffRules()

    def offered(self, name: str) -> bool:
        if name == RUN_SKILL:  # offered only when the tenant enables a skill
            return bool(self.skills)
        if is_mcp_name(name):  # a server's tool: only what its allow-list names
            return find_tool(self.mcp_servers, name) is not None
        if name in DELEGATION_TOOLS:
            return bool(self.specialists) and self._allowed(name)
        return self._allowed(name)

    def _allowed(self, name: str) -> bool:
        return self.tool_allowlist is None or name in self.tool_allowlist

    @classmethod
    def known_tools(cls) -> set[str]:
        return set(LOCAL_TOOLS)


def _holds_nul(value: object) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(_holds_nul(v) for v in value.values())
    if isinstance(value, list):
        return any(_holds_nul(v) for v in value)
    return False
