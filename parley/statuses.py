"""Every status that is stored in a row or sent to a client or a workflow, as a StrEnum.

A StrEnum member compares equal to its string and serializes as that string, so rows already
stored and workflow histories already committed read the same as before. Turn states and
message statuses live beside the other contract types in `parley.contracts`.
"""

from __future__ import annotations

from enum import StrEnum


class ActionStatus(StrEnum):
    """A proposed write's life: pending until the user answers, then one of the others."""

    pending = "pending"
    confirmed = "confirmed"
    declined = "declined"
    # Nobody answered within the window; a renewal (`POST .../renew`) is a new card.
    expired = "expired"
    # Code set it aside because the user moved on (a new message took the place of an
    # answer): not the user's "no".
    superseded = "superseded"
    executed = "executed"
    # The email service did not answer and could not be asked afterwards.
    unknown = "unknown"
    failed = "failed"


# Statuses from which `send_email` may (still) run: confirmed, or sent with no answer yet.
SENDABLE_ACTION_STATUSES = (ActionStatus.confirmed, ActionStatus.unknown)
# Statuses after which `send_email` has nothing left to do.
SETTLED_ACTION_STATUSES = (ActionStatus.executed, ActionStatus.failed)


class Decision(StrEnum):
    """The user's answer to a pending action, as signalled to the waiting turn."""

    confirmed = "confirmed"
    declined = "declined"
    # The user moved on: a new message took the place of an answer.
    superseded = "superseded"


class DeclineReason(StrEnum):
    """Why an action was declined by code rather than by the user (`actions.decline_reason`).
    A turn that ended cancelled or failed stores its terminal state instead. (A card the
    user moved on from is `ActionStatus.superseded`, not a decline.)"""

    turn_ended = "turn_ended"


class ToolCallStatus(StrEnum):
    """A tool call row's status; every status but `pending` is also a `ToolOutcome` status."""

    pending = "pending"
    ok = "ok"
    error = "error"
    # The workflow refused the call (repeated, over budget, not callable by the model).
    refused = "refused"


class FinalizeOutcome(StrEnum):
    """How the workflow asks its tail step (`finish_turn`) to end a turn."""

    completed = "completed"
    # The confirmation window passed without an answer.
    expired = "expired"
    # The user moved on; the stream closes with the turn's last message.
    superseded = "superseded"


class FinishReason(StrEnum):
    """Why a model call stopped (`model_calls.finish_reason`)."""

    stop = "stop"
    length = "length"
    tool_calls = "tool_calls"
    # Code, not the model, answered: the reference resolver asked the user to choose.
    clarification = "clarification"
    # The user steered the turn while this call streamed: stopped, its text kept as superseded.
    steered = "steered"


class TurnErrorCode(StrEnum):
    """The codes a client can read in a turn's `error` event: a fixed list, so an exception's
    class name (`OperationalError`) never reaches a client. Anything else maps to
    `model_failed` (see `turn_error_code`)."""

    model_failed = "model_failed"
    # The tenant's assistant was paused while the turn ran; retrying after a resume may help.
    agent_paused = "agent_paused"
    # A budget of the tenant or the user (in money) cannot take the model call's worst case:
    # the turn ends before the call (activities/budgets.py).
    budget_exhausted = "budget_exhausted"
    # The database stayed unreachable for longer than the step's schedule-to-close bound.
    store_unavailable = "store_unavailable"
    # The turn's workflow closed (execution timeout, a bug) without ending the turn.
    turn_abandoned = "turn_abandoned"
    # The prompt's required blocks do not fit the model's input budget (parley/context.py).
    context_too_large = "context_too_large"
    # The provider's own answers (gateway.errors), kept so the client can tell them apart.
    bad_request = "bad_request"
    unauthorized = "unauthorized"
    forbidden = "forbidden"
    not_found = "not_found"
    too_large = "too_large"
    unprocessable = "unprocessable"
    conflict = "conflict"
    rate_limited = "rate_limited"
    server_error = "server_error"
    client_error = "client_error"
    timeout = "timeout"
    first_token_timeout = "first_token_timeout"
    total_timeout = "total_timeout"
    connection = "connection"
    stream_dropped = "stream_dropped"
    stream_incomplete = "stream_incomplete"
    stream_error = "stream_error"


def turn_error_code(error_type: str | None) -> TurnErrorCode:
    """The client-visible code for a step's failure type (an `ApplicationError.type`)."""
    if error_type is not None and error_type in TurnErrorCode.__members__:
        return TurnErrorCode(error_type)
    return TurnErrorCode.model_failed


class ExportState(StrEnum):
    """An export's life (store/lifecycle/exports.py): asked for, being written, then ready or
    failed."""

    pending = "pending"
    running = "running"
    ready = "ready"
    failed = "failed"


class ImportState(StrEnum):
    """An imported conversation's life (store/imports.py): stored, being indexed for recall
    by meaning, then done (its every message searchable both ways)."""

    pending = "pending"
    indexing = "indexing"
    done = "done"
