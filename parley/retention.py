"""Retention: how long a tenant keeps each kind of data, and which tables each period covers.

Four periods, in days, each set per tenant (`TenantConfig.retention`) over the deployment's
defaults (`PARLEY_RETENTION_*_DAYS`); 0 keeps that kind forever. The daily purge
(workflows/retention.py) deletes, table by table, rows older than now minus the period:

- messages: the messages (their embeddings go with them), the feedback on them, the turns'
  event logs (the streamed deltas are copies of the answers), uploaded and produced files,
  result sets, resolved actions (their arguments hold what was sent), specialists' answers,
  conversation slots and hand-offs (by when each was written);
- prompts: the packed prompts and answers of model calls, the tool calls (their arguments
  and results) and the trace spans;
- summaries: rolling summary versions and pinned facts (by when they were last written);
- memory: consented memory items (they also expire by themselves after `PARLEY_MEMORY_TTL_DAYS`).

Prompts and summaries are copies of the conversation, so they never outlive its messages: with
a messages period set, theirs is at most as long (a tenant keeping messages 30 days and
prompts forever keeps prompts 30 days). Consented memory is the exception the user chose: it
is kept across sessions for its own period.

Exports whose link has expired are deleted whatever the periods. Sessions, turns (their
state and ids, no text) and usage counters stay.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from pydantic import BaseModel, ConfigDict, Field

from parley.wire import IntOrNone

# Every table a period covers, in the order the purge deletes them (rows that point at a
# row of a later table go first).
PERIOD_TABLES: dict[str, tuple[str, ...]] = {
    "messages": (
        "feedback",
        "messages",
        "turn_events",
        "session_events",
        "files",
        "result_sets",
        "actions",
        "specialist_answers",
        "slots",
        "handoff_events",
        "handoff_notes",
        "webhook_deliveries",
        "handoffs",
    ),
    "prompts": ("tool_calls", "model_calls", "trace_spans"),
    "summaries": ("conversation_summaries", "pinned_facts"),
    "memory": ("user_memory",),
}
EXPIRED_EXPORTS = "exports"
PERIODS = tuple(PERIOD_TABLES)


class RetentionPeriods(BaseModel):
    """A tenant's periods in days; an unset one is the deployment's default, 0 is forever."""

    model_config = ConfigDict(extra="forbid", strict=True)  # as TenantConfig

    messages_days: IntOrNone = Field(default=None, ge=0, le=36500)
    prompts_days: IntOrNone = Field(default=None, ge=0, le=36500)
    summaries_days: IntOrNone = Field(default=None, ge=0, le=36500)
    memory_days: IntOrNone = Field(default=None, ge=0, le=36500)

    def days(self, defaults: dict[str, int]) -> dict[str, int]:
        """Each period's days, the tenant's where set, else the default."""
        mine = {
            "messages": self.messages_days,
            "prompts": self.prompts_days,
            "summaries": self.summaries_days,
            "memory": self.memory_days,
        }
        days = {
            period: (value if value is not None else defaults.get(period, 0))
            for period, value in mine.items()
        }
        if days["messages"]:  # copies of the conversation go no later than the conversation
            for copy in ("prompts", "summaries"):
                days[copy] = min(days[copy] or days["messages"], days["messages"])
        return days


def purge_plan(days: dict[str, int], now: datetime) -> list[tuple[str, datetime]]:
    """The tables to purge for one tenant and the moment before which their rows go, in the
    order they must go; expired exports always."""
    plan = [
        (table, now - timedelta(days=days[period]))
        for period in PERIODS
        if days.get(period, 0) > 0
        for table in PERIOD_TABLES[period]
    ]
    return [*plan, (EXPIRED_EXPORTS, now)]
