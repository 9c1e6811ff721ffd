"""Types that cross a process boundary: workflow and activity inputs, turn states, events.

The API, the workflows and the activities all import this module, so a name changes in one
place. Every workflow/activity input is one dataclass (`...Input`) so that fields can be
added later with defaults without breaking replay of running turns. Inputs carry ids only:
prompts and transcripts live in PostgreSQL, never in workflow history.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from temporalio.common import SearchAttributeKey

TURN_WORKFLOW = "TurnWorkflow"

# Search attributes registered with the Temporal server so operators can find a turn by
# session or tenant and filter by state in the Temporal UI.
SA_SESSION_ID = SearchAttributeKey.for_keyword("ParleySessionId")
SA_TENANT_ID = SearchAttributeKey.for_keyword("ParleyTenantId")
SA_TURN_STATE = SearchAttributeKey.for_keyword("ParleyTurnState")
SEARCH_ATTRIBUTES = (SA_SESSION_ID, SA_TENANT_ID, SA_TURN_STATE)


class TurnState(StrEnum):
    received = "received"
    building_context = "building_context"
    calling_model = "calling_model"
    executing_tools = "executing_tools"
    awaiting_confirmation = "awaiting_confirmation"
    executing_action = "executing_action"
    completed = "completed"
    failed = "failed"
    cancelled = "cancelled"
    expired = "expired"


TERMINAL_TURN_STATES = frozenset(
    {TurnState.completed, TurnState.failed, TurnState.cancelled, TurnState.expired}
)


class EventType(StrEnum):
    state = "state"
    delta = "delta"
    reset = "reset"
    tool = "tool"
    confirmation_required = "confirmation_required"
    confirmation_resolved = "confirmation_resolved"
    clarification = "clarification"
    warning = "warning"
    retracted = "retracted"
    followups = "followups"
    done = "done"
    error = "error"
    cancelled = "cancelled"


TERMINAL_EVENTS = frozenset({EventType.done, EventType.error, EventType.cancelled})


class MessageStatus(StrEnum):
    complete = "complete"
    incomplete = "incomplete"
    cancelled = "cancelled"
    retracted = "retracted"


@dataclass
class TurnInput:
    turn_id: str
    session_id: str
    tenant_id: str


@dataclass
class SetStateInput:
    turn_id: str
    state: str


@dataclass
class BuildContextInput:
    turn_id: str


@dataclass
class BuildContextResult:
    # The prompt itself is stored in `model_calls`; only its id travels through history.
    model_call_id: str


@dataclass
class CallModelInput:
    turn_id: str
    model_call_id: str


@dataclass
class CallModelResult:
    model_call_id: str
    finish_reason: str
    output_chars: int


@dataclass
class FinalizeTurnInput:
    turn_id: str
    model_call_id: str


@dataclass
class FailTurnInput:
    turn_id: str
    code: str
    message: str
    retryable: bool = False
