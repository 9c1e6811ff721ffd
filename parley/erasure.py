"""Erasure: what crosses the process boundary when a user, or one deleted session, is erased.

An erasure is a row of `erasures` (its id is the only thing the workflow carries) and a
Temporal workflow, `erasure-<id>`, that stops the subject's turns, deletes their workflow
executions, then deletes every row the store's catalogue
(store/lifecycle/erasure_catalogue.py) names, table by table and in batches, and ends with a
receipt: the counts per table and the times, beside a keyed hash of the subject. The
subject's ids in clear are on the row only while it runs.
"""

# No `from __future__ import annotations`: decoded inside the workflow sandbox (contracts.py).

import hashlib
import hmac
from dataclasses import dataclass, field
from enum import StrEnum

ERASURE_WORKFLOW = "ErasureWorkflow"


class ErasureScope(StrEnum):
    user = "user"  # `DELETE /v1/me`, `parley erase`: every row of the user, then the user
    session = "session"  # a deleted session, after the grace period


class ErasureStatus(StrEnum):
    requested = "requested"  # the row is committed; the workflow may not have started yet
    running = "running"
    done = "done"


@dataclass
class ErasureInput:
    """The workflow's input: ids and a wait, never names or text."""

    erasure_id: str
    # Wait this long before erasing (a deleted session's grace period); 0: at once.
    grace_s: float = 0.0


@dataclass
class ErasurePlan:
    # The catalogue's tables that apply to the erasure's scope, in the order they are emptied
    # (rows that others point at go last).
    tables: list[str] = field(default_factory=list)


@dataclass
class EraseTableInput:
    erasure_id: str
    table: str


@dataclass
class ErasureReceipt:
    """What the workflow returns (and the row keeps): counts only, no personal data."""

    erasure_id: str
    counts: dict[str, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(self.counts.values())


def subject_hash(key: str, *parts: str) -> str:
    """The keyed hash a receipt keeps instead of its subject's ids (tenant, user and, for a
    session, the session): an operator who knows them, and the key, can find the receipt;
    the receipt alone names nobody."""
    message = "\x1f".join(parts).encode()
    return hmac.new(key.encode(), message, hashlib.sha256).hexdigest()


def erasure_workflow_id(erasure_id: str) -> str:
    """The erasure's workflow: one per erasure row, never run twice."""
    return f"erasure-{erasure_id}"
