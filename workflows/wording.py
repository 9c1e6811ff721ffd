"""What the turn says in its own words, when code rather than the model ends it, and how it
reads the errors its steps end with."""

from __future__ import annotations

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError, CancelledError

with workflow.unsafe.imports_passed_through():
    from parley.contracts import MAX_TOOL_CALLS_PER_RESPONSE
    from parley.statuses import TurnErrorCode

BOUNDS_TEXT = (
    "I've reached the limit of steps I can take for one answer, so I'll stop here. "
    "Please ask again, a little more specifically."
)
EXPIRED_TEXT = "The confirmation expired, so I did not send the email."
SENT_TEXT = "Done: the email was sent."
NOT_SENT_TEXT = "The email was not sent."
TOO_MANY_TOOLS = (
    f"at most {MAX_TOOL_CALLS_PER_RESPONSE} tool calls run per answer; "
    "ask for the rest in your next step"
)
BUDGET_SPENT = "turn budget spent"

# Provider answers that a retry of the same request would get again.
REQUEST_REFUSED = frozenset(
    {
        "bad_request",
        "unauthorized",
        "forbidden",
        "not_found",
        "too_large",
        "unprocessable",
        "context_too_large",
    }
)


def retries_spent(err: ActivityError) -> bool:
    """The primary failed for good after its retries, rather than refusing the request or
    being cancelled (which a fallback model would not change)."""
    cause = err.cause
    if isinstance(cause, CancelledError):
        return False
    return not isinstance(cause, ApplicationError) or not cause.non_retryable


def store_unavailable(err: ActivityError) -> bool:
    cause = err.cause
    return isinstance(cause, ApplicationError) and cause.type == TurnErrorCode.store_unavailable
