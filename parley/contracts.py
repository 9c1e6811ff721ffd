"""Types that cross a process boundary: workflow and activity inputs, turn states, events.

The API, the workflows and the activities all import this module, so a name changes in one
place. Every workflow/activity input is one dataclass (`...Input`) so that fields can be
added later with defaults without breaking replay of running turns. Inputs carry ids only:
prompts and transcripts live in PostgreSQL, never in workflow history.
"""

# No `from __future__ import annotations` here: these types are decoded inside the workflow
# sandbox, where `typing.get_type_hints` cannot see this module's globals (dispatch/runner.py).

from dataclasses import dataclass, field
from enum import StrEnum

from temporalio.common import SearchAttributeKey

# Action, tool call and decision statuses: their own pure module, re-exported here.
from parley.statuses import ActionStatus as ActionStatus
from parley.statuses import Decision as Decision
from parley.statuses import DeclineReason as DeclineReason
from parley.statuses import FinalizeOutcome as FinalizeOutcome
from parley.statuses import FinishReason as FinishReason
from parley.statuses import ToolCallStatus as ToolCallStatus

TURN_WORKFLOW = "TurnWorkflow"
# Folds older turns into the session's rolling summary: one per session at a time, started
# or signalled by the turns that finish while it runs (workflows/summary.py).
SUMMARY_WORKFLOW = "SummaryWorkflow"
# A finished turn's "the summary is due" to the session's summary workflow (signal-with-start).
SUMMARY_DUE_SIGNAL = "summary_due"

# Search attributes registered with the Temporal server so operators can find a turn by
# session or tenant and filter by state in the Temporal UI.
SA_SESSION_ID = SearchAttributeKey.for_keyword("ParleySessionId")
SA_TENANT_ID = SearchAttributeKey.for_keyword("ParleyTenantId")
SA_TURN_STATE = SearchAttributeKey.for_keyword("ParleyTurnState")
SEARCH_ATTRIBUTES = (SA_SESSION_ID, SA_TENANT_ID, SA_TURN_STATE)


class TurnState(StrEnum):
    # Posted while the session's turn runs: it waits, outside the conversation, until that
    # turn ends, then moves to `received` (store/queue.py).
    queued = "queued"
    received = "received"
    building_context = "building_context"
    calling_model = "calling_model"
    executing_tools = "executing_tools"
    awaiting_confirmation = "awaiting_confirmation"
    # A specialist asked the user something and waits for the answer (parley/specialists.py).
    awaiting_input = "awaiting_input"
    executing_action = "executing_action"
    completed = "completed"
    failed = "failed"
    cancelled = "cancelled"
    expired = "expired"


TERMINAL_TURN_STATES = frozenset(
    {TurnState.completed, TurnState.failed, TurnState.cancelled, TurnState.expired}
)


class WarningCode(StrEnum):
    """What a `warning` event says degraded (the turn goes on)."""

    context_trimmed = "context_trimmed"
    tool_unavailable = "tool_unavailable"
    mcp_unavailable = "mcp_unavailable"
    knowledge_unavailable = "knowledge_unavailable"
    skill_failed = "skill_failed"
    skill_timed_out = "skill_timed_out"
    sandbox_unavailable = "sandbox_unavailable"
    recall_pending = "recall_pending"


class EventType(StrEnum):
    state = "state"
    delta = "delta"
    reset = "reset"
    tool = "tool"
    confirmation_required = "confirmation_required"
    confirmation_resolved = "confirmation_resolved"
    confirmation_expiring = "confirmation_expiring"  # a card lapses soon (dispatch/approvals)
    clarification = "clarification"
    warning = "warning"
    retracted = "retracted"
    followups = "followups"
    citations = "citations"
    subagent = "subagent"
    interaction = "interaction"
    done = "done"
    error = "error"
    cancelled = "cancelled"
    artifact = "artifact"
    steered = "steered"


TERMINAL_EVENTS = frozenset({EventType.done, EventType.error, EventType.cancelled})


class MessageStatus(StrEnum):
    complete = "complete"
    incomplete = "incomplete"
    cancelled = "cancelled"
    retracted = "retracted"


# Hard bounds of the tool loop (design.md): a turn never runs away.
MAX_MODEL_CALLS = 8
MAX_OUTPUT_TOKENS = 4000
# Attempts of one tool call before its failure goes back to the model as a structured error.
TOOL_ATTEMPTS = 3
DEFAULT_CONFIRMATION_TIMEOUT_S = 600.0

# A decision as a Workflow Update, the one way the API delivers it (dispatch/control.py): the
# turn's validator takes only the decision it waits for, and the API retries until it does.
RESOLVE_ACTION_UPDATE = "decide_action"
RESOLVE_ACTION_SIGNAL = "resolve_action"  # the same as a signal (build 12's turns took it)
STEER_UPDATE = "steer"  # for the turn's history: the store's doorbell is what takes it
# At most this many tool calls of one model response run; the rest are refused to the model.
MAX_TOOL_CALLS_PER_RESPONSE = 8
# `ApplicationError` types never shown to a client: a step tells the workflow to stop (the turn
# ended, or its Stop was recorded, meanwhile); an ending that a newer steer holds back.
TURN_STOPPED, TURN_STEERED = "turn_stopped", "turn_steered"


@dataclass
class TurnInput:
    turn_id: str
    session_id: str
    tenant_id: str
    # Fixed at start so the wait is deterministic on replay, whatever the worker's settings.
    confirmation_timeout_s: float = DEFAULT_CONFIRMATION_TIMEOUT_S
    # Whether a fallback model is configured, fixed at start like the timeout: when the
    # primary's retries are spent, a turn without one fails at once instead of scheduling a
    # model call only to learn that there is no fallback.
    fallback: bool = False


@dataclass
class BuildContextInput:
    turn_id: str
    # 0 for the first model call of the turn; later steps follow tool results.
    step: int = 0
    # The model call whose tool loop hit the turn's cap: this step re-answers from what the
    # turn has, without tools (parley/paths.py).
    reanswer_of: str | None = None


@dataclass
class BuildContextResult:
    # The prompt itself is stored in `model_calls`; only its id travels through history.
    model_call_id: str
    # True when code, not the model, answers: the reference resolver asked the user to choose.
    clarification: bool = False
    steer_seq: int | None = None  # the newest steer the step takes (store/steering.py)


@dataclass
class CallModelInput:
    turn_id: str
    model_call_id: str
    # The primary's retries are spent: the configured fallback model answers instead.
    fallback: bool = False


@dataclass
class OpenStepInput:
    """A model step opened in one local step (turn build 14, activities/opening.py): its
    context built (beside the input screen, for the turn's first), then its model called."""

    turn_id: str
    step: int = 0
    reanswer_of: str | None = None  # as BuildContextInput's
    screen_input: bool = False  # the turn's own message is screened beside the build
    # The newest steer the turn's earlier steps screened: steers the build takes past it are
    # screened before the model sees them.
    steers_screened: int = 0


@dataclass
class ToolCallRef:
    """What the workflow needs to schedule a tool call; the arguments stay in the store."""

    call_id: str
    name: str
    args_hash: str


@dataclass
class CallModelResult:
    model_call_id: str
    finish_reason: str
    output_chars: int
    output_tokens: int = 0
    tool_calls: list[ToolCallRef] = field(default_factory=list)
    # Requests sent to providers for this call: retries and the fallback each count one.
    attempts: int = 1


@dataclass
class OpenStepResult:
    built: BuildContextResult
    # What the input screen said of the turn's message (or, `steer_declined`, of the steers
    # the build took): a declined step calls no model.
    allowed: bool = True
    steer_declined: bool = False
    # The model's answer; None when no model was called (declined, or code asks the user).
    call: CallModelResult | None = None


@dataclass
class ExecuteToolInput:
    turn_id: str
    call_id: str
    # Set by the workflow when it refuses a call (repeated, over budget, not callable by the
    # model): the refusal is recorded as the call's result and nothing runs.
    refuse: str | None = None
    # How long a proposal made by this call waits for confirmation (the workflow's wait).
    confirmation_timeout_s: float = DEFAULT_CONFIRMATION_TIMEOUT_S


@dataclass
class ToolOutcome:
    call_id: str
    status: str  # a ToolCallStatus other than pending
    action_id: str | None = None  # a proposal recorded a pending action


@dataclass
class RequestConfirmationInput:
    turn_id: str
    action_id: str
    model_call_id: str


@dataclass
class ResolveActionSignal:
    action_id: str
    decision: str  # a Decision


@dataclass
class SteerInput:
    message_id: str  # the stored message (its text stays in the store)
    seq: int = 0


@dataclass
class ActionInput:
    turn_id: str
    action_id: str


@dataclass
class ActionResult:
    action_id: str
    status: str  # the action's status after the step: executed | unknown | failed | expired ...


@dataclass
class ScreenInput:
    turn_id: str
    # The model call whose answer the output screen checks; None for the input screen.
    model_call_id: str | None = None
    steers_after: int | None = None  # the input screen checks the turn's steers after this seq


@dataclass
class ScreenResult:
    allowed: bool
    category: str | None = None


@dataclass
class FinalizeTurnInput:
    turn_id: str
    model_call_id: str
    # A FinalizeOutcome: completed ends the turn; expired ends it after a confirmation timed
    # out; superseded ends it quietly because the user moved on.
    outcome: str = "completed"
    # Text written by code instead of the model (bounds reached, confirmation expired).
    override_text: str | None = None
    # The output screen withdrew the streamed answer: store `override_text` in its place,
    # marked `retracted`, and tell the stream.
    retract: bool = False
    steerable: bool = True  # a steer newer than the last model call holds it back


@dataclass
class FinishTurnInput:
    """The turn's tail in one step: screen the answer and offer follow-ups (`screen`), store
    the ending, then start the rolling summary when it is due."""

    finalize: FinalizeTurnInput
    session_id: str
    screen: bool = False

    @property
    def turn_id(self) -> str:
        """The turn, as every step's input names it (its trace span and log lines)."""
        return self.finalize.turn_id


@dataclass
class TurnOutcome:
    """How a turn ended, as its workflow returns it: `ending` is completed, expired,
    superseded, failed or stopped; `message_id` the stored answer's, when there is one."""

    ending: str
    message_id: str | None = None


@dataclass
class FailTurnInput:
    turn_id: str
    code: str
    message: str
    retryable: bool = False


@dataclass
class SummarizeInput:
    """What the session's summary workflow starts with, what each finished turn signals it,
    and what each of its passes hands its step."""

    session_id: str
    # The turn after which the summary runs (ids only: the messages stay in the store).
    turn_id: str
    # The summary's step runs as a local activity of its workflow's task (a turn's ending
    # asks so): one task for the server, not three. A pass asked for from outside a turn
    # (after a forgotten message, dispatch/summaries.py) runs it as a regular activity.
    local: bool = False


@dataclass
class SummarizeResult:
    # The summary's new end, or the old one when there was nothing (yet) to fold in.
    through_seq: int
    summarized: bool = False
    # The passes the workflow's run made (its result; a step's own result leaves it at 1):
    # one, and one more each time turns asked while a pass was under way.
    passes: int = 1


# --- specialists (parley/specialists.py, workflows/specialist.py) ----------------------------

SPECIALIST_WORKFLOW = "SpecialistWorkflow"
# The user's answer to a specialist's question, bound to the question's interaction id.
ANSWER_INTERACTION_SIGNAL = "answer_interaction"
DEFAULT_SPECIALIST_WAIT_S = 600.0


@dataclass
class SpecialistInput:
    """A specialist started by a turn: ids only (the order is read back from the tool call)."""

    turn_id: str
    # The delegating tool call (its arguments stay in the store).
    call_id: str
    name: str = "returns"


@dataclass
class SpecialistPlan:
    """The specialist's bounds, read from the worker's settings once and kept in history, so
    a replay waits exactly as long as the original run."""

    order_id: str
    wait_s: float = DEFAULT_SPECIALIST_WAIT_S
    confirmation_timeout_s: float = DEFAULT_CONFIRMATION_TIMEOUT_S
    # Questions asked at most (an answer that names no option is asked again); with a real
    # model, the specialist's model calls at most (parley/returns_agent.py).
    max_steps: int = 6
    # A real model drives the specialist (its own agent loop); False: the demo's fixed steps.
    agent: bool = False


@dataclass
class AgentStepInput:
    """One model call of the specialist's agent loop: its step (0, 1, ...) and the
    delegating tool call (the order and the provider are read back from the store)."""

    turn_id: str
    call_id: str
    step: int


@dataclass
class AgentCall:
    """A tool call of one reply, by its position in the reply; `refused` when it does not
    run (an unknown tool, arguments that did not check: the model is told why)."""

    position: int
    name: str
    refused: bool = False


@dataclass
class AgentStep:
    model_call_id: str
    calls: list[AgentCall]
    # Whether the reply had words (with no calls: the specialist's last words).
    said: bool = False


@dataclass
class AgentToolInput:
    """One tool call of a specialist's reply, by the model call and its position; for a
    question, the interaction it is shown as, and then the chosen option's value."""

    turn_id: str
    model_call_id: str
    position: int
    order_id: str
    interaction_id: str = ""
    value: str = ""
    confirmation_timeout_s: float = DEFAULT_CONFIRMATION_TIMEOUT_S


@dataclass
class AskInput:
    turn_id: str
    interaction_id: str
    # "item" or "reason": which question (its options are built by the activity).
    question: str
    order_id: str


@dataclass
class InteractionAnswer:
    interaction_id: str
    # The chosen option's value, or "" when the user's words matched no option.
    value: str


@dataclass
class ReturnWindowResult:
    eligible: bool


@dataclass
class ProposeReturnInput:
    turn_id: str
    order_id: str
    item_id: str
    reason: str
    confirmation_timeout_s: float = DEFAULT_CONFIRMATION_TIMEOUT_S


@dataclass
class SpecialistEndInput:
    turn_id: str
    outcome: str  # a SpecialistOutcome
    # The proposed action, when there was one (its outcome holds the RMA id).
    action_id: str | None = None
    name: str = "returns"
    # The model call whose words end the specialist (a real model that answered in words).
    model_call_id: str | None = None
