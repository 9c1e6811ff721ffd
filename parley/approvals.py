"""Approvals with an honest clock: the rules of a confirmation card's window.

A card (a pending action, store/actions.py) lapses at its `expires_at`. A while before, the
worker's outbox sweep shows `confirmation_expiring` once (dispatch/approvals.py), the lead
time being the tenant's `confirmation_warning_s` over the deployment's. A lapsed card can be
asked for again (`POST .../renew`, api/routes/actions.py): a new card with the same tool,
arguments and digest and a new window, answered through a workflow of its own
(workflows/renewal.py), never a new model call.

How a card ended is one of four outcomes, kept apart everywhere (store, stream, page,
export, metrics): `confirmed` (then `executed`, `failed` or `unknown`), `declined` (by the
user, or by code when the turn ended), `expired` (nobody answered in time) and `superseded`
(the user moved on). `CARD_OUTCOMES` counts them as they are announced.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import Counter

from parley.statuses import ActionStatus

# Waits for the answer to a card renewed after it expired, then sends once (or not): the turn
# that proposed it has ended, so this stands in for its confirmation wait. Its input lives
# here, with the rules it serves (parley/contracts.py is at its size limit).
RENEWAL_WORKFLOW = "RenewalWorkflow"


@dataclass
class RenewalInput:
    action_id: str  # the renewal's own id (its row names the expired card it renews)
    turn_id: str  # the turn whose stream shows the card and the send
    wait_s: float  # the card's window, as its `expires_at` was set


# The statuses that answer a card (a `confirmation_resolved` event carries one of them).
OUTCOMES = (
    ActionStatus.confirmed,
    ActionStatus.declined,
    ActionStatus.expired,
    ActionStatus.superseded,
)

# Counted where each is announced, by the process that announced it (the API for answers and
# a window that passed at a confirm; the worker for a window its timer closed).
CARD_OUTCOMES = Counter(
    "parley_confirmation_outcomes_total",
    "Confirmation cards by how they ended: confirmed, declined, expired, superseded",
    ["outcome"],
)
CARD_WARNINGS = Counter(
    "parley_confirmation_warnings_total", "`confirmation_expiring` warnings shown"
)
CARD_RENEWALS = Counter(
    "parley_confirmation_renewals_total", "Expired cards asked for again (`POST .../renew`)"
)
