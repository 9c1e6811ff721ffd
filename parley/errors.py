"""Domain errors raised by the store and the turn machinery.

    ParleyError
    ├── NotFound                  resource missing or owned by someone else (never 403)
    ├── Unauthenticated           missing, unknown or revoked bearer token
    ├── Conflict
    │   ├── StaleView             client's expected_last_seq is behind the session
    │   ├── TurnInProgress        the session already has an active turn
    │   ├── TurnFinished          the turn has already reached a terminal state
    │   ├── TurnNotRetryable      the turn's answer is not incomplete or cancelled
    │   ├── ActionResolved        the action was already confirmed or declined
    │   ├── ActionExpired         the confirmation window has passed
    │   ├── ActionChanged         the stored arguments no longer match what was shown
    │   ├── ActionNotExpired      only an expired card can be renewed
    │   ├── ExportNotReady        the export's archive is still being written
    │   ├── HandoffClaimed        another agent holds the hand-off
    │   ├── HandoffOpen           a person holds the session (edit, regenerate, retry wait)
    │   ├── HandoffClosed         the hand-off has ended (resolved or handed back)
    │   └── BudgetApprovalDecided the budget approval was decided already (or timed out)
    ├── IdempotencyKeyReused      same client_message_id, different text
    ├── InvalidRequest            a field breaks the contract (names the field)
    │   └── UrlNotAllowed         an address the deployment's egress rules refuse (names the rule)
    ├── AgentPaused               the tenant's assistant is switched off
    ├── Forbidden                 the caller lacks the role (admin and agent routes)
    │   └── FeatureNotEnabled     the user's `assistant` feature is revoked
    ├── RateLimited               too many of something at once (carries retry_after_s)
    ├── ExportExpired             an export's download link has passed its validity
    └── ContextTooLarge           the required part of a prompt exceeds the model's input budget

HTTP status codes are assigned to these in one place, `api/errors.py`.
"""

from __future__ import annotations

from typing import Any


class ParleyError(Exception):
    code = "internal_error"

    def __init__(self, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.message = message
        self.extra = extra


class NotFound(ParleyError):
    code = "not_found"


class Unauthenticated(ParleyError):
    code = "unauthenticated"


class Conflict(ParleyError):
    code = "conflict"


class StaleView(Conflict):
    code = "stale_view"


class TurnInProgress(Conflict):
    code = "turn_in_progress"


class TurnFinished(Conflict):
    code = "turn_finished"


class ActionResolved(Conflict):
    code = "action_resolved"


class ActionSuperseded(Conflict):
    """The card was left pending when the user moved on: a new message, or another version
    of the conversation (store/branches.py)."""

    code = "action_superseded"


class ActionExpired(Conflict):
    code = "action_expired"


class ActionChanged(Conflict):
    code = "action_changed"


class ActionNotExpired(Conflict):
    code = "action_not_expired"


class TurnNotRetryable(Conflict):
    code = "turn_not_retryable"


class IdempotencyKeyReused(ParleyError):
    code = "idempotency_key_reused"


class Forbidden(ParleyError):
    code = "forbidden"


class FeatureNotEnabled(Forbidden):
    """The user's access to the assistant is revoked: no new turns (history stays readable)."""

    code = "feature_not_enabled"


class InvalidRequest(ParleyError):
    code = "invalid_request"


class UrlNotAllowed(InvalidRequest):
    """A URL in a tenant's config that the deployment may not reach (parley/egress.py); its
    `rule` says which rule refused it."""

    code = "url_not_allowed"


class AgentPaused(ParleyError):
    code = "agent_paused"


class RateLimited(ParleyError):
    """A per-minute limit (or the open streams' cap) is reached: 429 with `Retry-After`."""

    code = "rate_limited"

    def __init__(self, message: str, *, retry_after_s: int = 1, **extra: Any) -> None:
        super().__init__(message, **extra)
        self.retry_after_s = retry_after_s


class TooManyActiveTurns(RateLimited):
    """The user already has as many answers running as the deployment allows."""

    code = "too_many_active_turns"


class DailyCapReached(RateLimited):
    """The user's or the tenant's messages of the UTC day reached the cap."""

    code = "daily_cap_reached"


class ContextTooLarge(ParleyError):
    """The blocks a prompt cannot do without (instructions, state, the current message) do
    not fit the model's window minus the output reserve: the turn fails loudly."""

    code = "context_too_large"


class ExportExpired(ParleyError):
    """An export's link has passed its validity (`PARLEY_EXPORT_LINK_TTL_S`): ask for another."""

    code = "export_expired"


class HandoffClaimed(Conflict):
    code = "handoff_claimed"


class HandoffClosed(Conflict):
    code = "handoff_closed"


class HandoffOpen(Conflict):
    code = "handoff_open"


class BudgetApprovalDecided(Conflict):
    """The tenant's month over budget was approved, declined or timed out already."""

    code = "budget_approval_decided"


class ExportNotReady(Conflict):
    """The export's archive is still being written; its status says how far it got."""

    code = "export_not_ready"
