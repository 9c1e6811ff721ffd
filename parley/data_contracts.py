"""Types of the data workflows that cross a process boundary: a user's export, the retention
purge and an import's indexing. As in parley/contracts.py, inputs carry ids only.
"""

# No `from __future__ import annotations` here, as in parley/contracts.py: these types are
# decoded inside the workflow sandbox.

from dataclasses import dataclass, field

# A user's data leaving and expiring: the export workflow writes one archive
# (workflows/export.py); the retention purge deletes what a tenant's periods let go
# (workflows/retention.py), run daily by a Temporal Schedule.
EXPORT_WORKFLOW = "ExportWorkflow"
PURGE_WORKFLOW = "RetentionPurgeWorkflow"
PURGE_SCHEDULE_ID = "parley-retention-purge"


@dataclass
class ExportInput:
    export_id: str


@dataclass
class ExportResult:
    export_id: str
    state: str  # an ExportState
    counts: dict[str, int] = field(default_factory=dict)


@dataclass
class PurgeInput:
    # The moment the periods count back from, ISO 8601; None: the workflow's own clock (a
    # scheduled run). Tests and operators set it to purge "as of" another day.
    now: str | None = None
    # Only this tenant; None: every tenant.
    tenant_id: str | None = None
    batch_size: int = 500


@dataclass
class PurgeTask:
    """One table of one tenant: rows older than `cutoff` (ISO 8601) go."""

    tenant_id: str
    table: str
    cutoff: str


@dataclass
class PurgePlan:
    tasks: list[PurgeTask] = field(default_factory=list)


@dataclass
class PurgeBatchInput:
    task: PurgeTask
    batch_size: int


@dataclass
class PurgeResult:
    # Rows deleted by table, over every tenant.
    purged: dict[str, int] = field(default_factory=dict)


# An import's indexing (workflows/imports.py): ids only, its messages stay in the store.
IMPORT_WORKFLOW = "ImportWorkflow"


@dataclass
class ImportInput:
    import_id: str
    session_id: str
