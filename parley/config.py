"""One `Settings` object, read from the environment with safe development defaults.

Every process (API, worker, CLI, tests) builds it the same way, so a variable set before
`make run` reaches every component.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from parley.egress import Allowlist
from parley.ids import workflow_id_for_turn

# How long a hand-off case waits for a claim before the customer is told, unless the
# deployment (`PARLEY_HANDOFF_CLAIM_TIMEOUT_S`) or its tenant
# (`TenantConfig.handoff_claim_timeout_s`) says otherwise.
DEFAULT_CLAIM_TIMEOUT_S = 300.0

REPO_ROOT = Path(__file__).resolve().parent.parent
# The erasure receipt key a dev stack uses; refused outside dev (`Settings`).
DEV_ERASURE_RECEIPT_KEY = "parley-dev-erasure-receipt-key"


@dataclass(frozen=True)
class Limits:
    """The admission limits the store checks (store/limits.py); built from `Settings`."""

    active_turns_per_user: int = 3
    turn_stale_after_s: float = 600.0
    user_per_minute: int = 20
    tenant_per_minute: int = 600
    sessions_per_user_per_day: int = 200
    user_per_day: int | None = 500


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="PARLEY_", extra="ignore")

    env: str = "dev"
    # External services. Unset DATABASE_URL means "embedded PostgreSQL under data_dir".
    database_url: str | None = Field(
        default=None, validation_alias=AliasChoices("DATABASE_URL", "PARLEY_DATABASE_URL")
    )
    # Where the LISTEN connections go (the API's event listener, the workers' outbox bell):
    # a session of their own, so PostgreSQL itself when DATABASE_URL is a pooler in
    # transaction mode (docs/operations.md, PgBouncer). Unset: DATABASE_URL.
    listen_database_url: str | None = None
    temporal_address: str = Field(
        default="127.0.0.1:7233",
        validation_alias=AliasChoices("TEMPORAL_ADDRESS", "PARLEY_TEMPORAL_ADDRESS"),
    )
    temporal_namespace: str = "default"
    task_queue: str = "parley-turns"
    data_dir: Path = REPO_ROOT / ".data"

    api_host: str = "127.0.0.1"
    api_port: int = 8000
    # Ports of the Temporal dev server that `parley dev` starts when TEMPORAL_ADDRESS is unset.
    dev_temporal_port: int = 7233
    temporal_ui_port: int = 8233
    # The Temporal Web UI that operators use, e.g. `http://127.0.0.1:8233`. When set, the web
    # page links each answer to its turn's workflow there; unset, it shows no links. `parley
    # dev` sets it to the UI of the dev server it starts.
    temporal_ui_url: str = ""

    # Contract limits.
    max_message_chars: int = 8000
    # Any request body over this is refused (413) before it is read or parsed. The longest
    # message, every character escaped as a JSON surrogate pair, still fits.
    max_body_bytes: int = 128 * 1024
    # An uploaded file (`POST .../files`): its request body may be this long (multipart
    # framing included), refused 413 before it is read like any other body.
    max_file_bytes: int = 5 * 1024 * 1024
    # An imported conversation (`POST .../import`): at most this many messages a request, each
    # at most `max_message_chars` long, in a body of at most this many bytes (413 above it).
    max_import_messages: int = 2000
    max_import_bytes: int = 8 * 1024 * 1024

    # Streaming: deltas are coalesced into frames of this many milliseconds; a worker that
    # streams many answers at once lengthens them so that it writes about `stream_frames_per_s`
    # frames a second in all, up to `stream_frame_max_ms` (activities/frames.py).
    stream_frame_ms: int = 40
    stream_frame_max_ms: int = 90  # the design's "frames of tens of milliseconds"
    stream_frames_per_s: float = Field(default=50.0, gt=0)
    stream_keepalive_s: float = 15.0
    # A client that disconnects does not cancel at once: the turn runs on this long so that
    # a reconnect can resume; if nobody reattaches, it is cancelled.
    stream_grace_s: float = 30.0
    # The same for the AI SDK chat stream, whose client's Stop only closes the connection
    # (api/routes/ai_sdk.py): short, so a Stop stops soon; a resume (a reload) within it
    # keeps the turn.
    ai_sdk_stop_grace_s: float = Field(default=3.0, ge=0)
    # The reconnect delay suggested to EventSource clients (`retry:` at stream start).
    stream_retry_ms: int = 1000
    # A consumer whose socket accepts nothing for this long is dropped (it resumes from the
    # log when it reconnects); it never slows the turn or other streams.
    stream_send_timeout_s: float = 10.0
    # Open event streams per user across every API process (store/limits.py leases).
    max_streams_per_user: int = 8
    # A stream's lease lapses this long after its API process stopped renewing it (a crash).
    stream_lease_s: float = 60.0

    # Abuse limits, kept in PostgreSQL so every API process shares them, checked cheapest
    # first before a posted message may start any model work (store/limits.py).
    # Turns of one user running at once (a turn resting on a confirmation does not count,
    # nor one that has made no progress for `turn_stale_after_s`: its worker is gone).
    max_active_turns_per_user: int = 3
    turn_stale_after_s: float = 600.0
    # Posted messages and retries per minute, per user and per tenant (429 `rate_limited`).
    user_requests_per_minute: int = 20
    tenant_requests_per_minute: int = 600
    # New sessions per user per UTC day.
    max_sessions_per_user_per_day: int = 200
    # Messages per user per UTC day (a tenant's `user_daily_cap` overrides it; 0: no cap).
    user_daily_messages: int = 500
    # Where the worker serves its Prometheus metrics (model calls, tokens, and the Temporal
    # SDK's own: slots, schedule-to-start latency, sticky cache); 0 turns it off.
    worker_metrics_port: int = 9464
    # A stopping worker (SIGTERM) polls no more and lets its running steps finish for this
    # long before cancelling them: long enough for a whole streamed answer, so a rolling
    # restart resets nobody's stream. Deployments give the process a little more
    # (docker-compose.yml `stop_grace_period`).
    worker_shutdown_grace_s: float = 90.0
    # Activities one worker runs at once. The worker's pool is sized from this so a step never
    # waits for a connection behind other steps (a streaming step holds none while the model
    # streams: its frames go through the worker's one writer).
    worker_max_activities: int = 32
    # Worker Deployment Versioning (dispatch/deployment.py), on by default so that a new shape
    # of the turn is a new build rather than a `workflow.patched()` branch: each worker joins
    # this deployment under `worker_build_id`, turns are pinned to the version they started
    # on, and old workers drain their own turns while new turns go to the current version.
    # Empty: workers are unversioned (any worker takes any turn, so a change of the workflow
    # may only ship once no turn is running: the code keeps no patches for older shapes).
    worker_deployment: str = "parley"
    # The version's build id; empty: the package version and, in a git checkout, the commit
    # (outside one, a digest of the installed files). Workers of one build share a version.
    worker_build_id: str = ""
    # A starting versioned worker makes its version the deployment's current one (new turns
    # go to it). Off for a deploy promoted by hand (`temporal worker deployment
    # set-current-version`) after the new workers are seen healthy.
    worker_promote: bool = True

    # The API process also runs a worker on its own Temporal client and starts turns with
    # `request_eager_start`: the server answers the start with the turn's first workflow task
    # and this process runs it, skipping a trip through matching (bench/eager_start.py: about
    # 80% off the time from start to a first step). The trade: the API process is then a
    # worker too: it runs the turns it starts (their first task, the activities that task
    # schedules), needs a worker's database pool, sandbox and drain, and deploys like a
    # worker. Eager starts pin a turn to the API's own build, whatever version is current, so
    # the API and the workers must run one build. Off: the API only starts turns.
    api_worker: bool = False
    # The worker that claims a posted turn's start begins the turn's first context build
    # beside the start, while Temporal starts the workflow (activities/early_build.py); the
    # first step, eagerly on that worker, takes it from memory. Off: the first step builds.
    early_build: bool = True
    # Workflow code runs outside Temporal's sandbox: its determinism checks are made by the
    # replay tests, under the SDK's default sandbox, for every committed history and every
    # registered workflow's module (dispatch/runner.py). On ("on", "true", "1"): every run
    # builds and enters the sandbox again, which refuses the clock, randomness and I/O at
    # run time, at 1.5 to 3 ms of worker CPU a turn.
    workflow_sandbox: bool = False

    # Logs: "text" (the dev default, one readable line) or "json" (one object per line, with
    # the turn, session and tenant ids when known). Addresses and card numbers are redacted
    # in both.
    log_format: str = "text"
    log_level: str = "INFO"
    # OpenTelemetry traces (dispatch/otel.py): the OTLP/HTTP collector's base URL, e.g.
    # `http://127.0.0.1:4318` (spans go to `/v1/traces`). Empty, the default: no tracing, and
    # no OpenTelemetry code is loaded. The SDK's own OTEL_* variables (headers, timeout, batch
    # delay, service name) still apply.
    otlp_endpoint: str = ""

    # Context building.
    system_prompt: str = (
        "You are the Northwind Outfitters assistant. Answer from facts you were given; "
        "never invent an order status, a date or an amount."
    )
    # Token budgets (tenant config overrides the window, the reserve and the conversation
    # budget's floor, share and ceiling). The prompt's input budget is the window minus the
    # reserve. Within it, the conversation context (pinned facts, rolling summary, recalled
    # messages and the recent turns, which get what the others leave) shares one budget that
    # follows what there is to remember (parley/budget.py): `share` of the session's distinct
    # text, at least the floor (`context_conversation_tokens`: a short chat's prompt at turn
    # 60 costs what it cost at turn 10) and at most the ceiling.
    context_window_tokens: int = 16384
    output_reserve_tokens: int = 1024
    context_conversation_tokens: int = 600
    context_conversation_share: float = Field(default=0.09, ge=0.0, le=1.0)
    context_conversation_max_tokens: int = Field(default=4000, ge=300)
    context_summary_tokens: int = 150
    # Recall's tokens at the floor for a follow-up (the split scales with the budget); a
    # question that reaches back (its words are not in the last turns) gives recall this
    # share of the conversation budget instead.
    context_recall_tokens: int = 200
    context_recall_reach_back_share: float = Field(default=0.95, ge=0.0, le=1.0)
    # Tool results older than this many turns are shown as metadata, not payloads.
    context_tool_result_age_turns: int = 2
    # An older message longer than this is cut in the window (recall still finds all of it).
    context_message_max_tokens: int = 600
    # A paste over half the input budget is cut into chunks of this size.
    context_paste_chunk_tokens: int = 300
    # Recall by meaning as well as by words: "" (full-text only) or "local-minilm" (the
    # optional `embeddings` extra; see gateway/minilm.py). Falls back to full-text when the
    # extra, the weights or PostgreSQL's `vector` extension is missing.
    embeddings: str = "local-minilm"
    # The local MiniLM's arithmetic: "int8" (its linear layers on 8-bit integers, a third to a
    # half of the CPU a text) or "float32" (the reference). Vectors of both are stored under
    # one model name and compared with each other (gateway/minilm.py says why that is safe).
    embeddings_precision: Literal["int8", "float32"] = "int8"
    # The text of every file attached to one message shares this many characters of the
    # prompt, split evenly; a file over its share is chunked and searched like a paste.
    context_file_chars: int = 24_000
    # The rolling summary runs after a turn once this many tokens have left the window.
    summary_min_new_tokens: int = 150
    # After a version the model could not write (the code's fallback), the next runs fold by
    # code without asking it, and it is asked again every this-many runs (parley/fold.py
    # `ask_the_model`; 1: ask every run).
    summary_model_retry_every: int = Field(default=8, ge=1)
    # The session's summary workflow starts this long after the turn that asked for it: a
    # customer reads the answer before writing again, so the summarizer runs while the session
    # is idle rather than beside the next turn on the same cores (0: at once). The server holds
    # the run's first task back; another turn's ask meanwhile releases it at once.
    summary_start_delay_ms: int = 1500
    # Durable, consented memory (parley/consented.py): how long a remembered item lives.
    memory_ttl_days: int = 180

    # Exports (`GET /v1/me/export`, `parley export`): how long an export's status and
    # download links answer before they are 410 `export_expired` (the purge then deletes it).
    export_link_ttl_s: float = Field(default=86400.0, gt=0)
    # Retention (parley/retention.py): the default periods in days, for tenants whose config
    # sets none; 0 keeps that kind of data forever. A tenant's `retention` overrides each.
    retention_messages_days: int = Field(default=0, ge=0)
    retention_prompts_days: int = Field(default=0, ge=0)
    retention_summaries_days: int = Field(default=0, ge=0)
    retention_memory_days: int = Field(default=0, ge=0)
    # When the daily purge runs (a cron line, UTC), as the Temporal Schedule each worker
    # creates or updates at start; rows deleted per statement.
    retention_purge_cron: str = "30 3 * * *"
    retention_batch_size: int = Field(default=500, ge=1, le=50_000)

    # Knowledge documents (parley/knowledge.py): the prompt's budget for passages and how many
    # retrieved passages are candidates. An embedding model (any OpenAI-compatible server's
    # `/v1/embeddings`; base URL default `OPENAI_BASE_URL`) adds vector search beside full-text
    # search; empty, retrieval is full-text only.
    knowledge_tokens: int = 900
    knowledge_passages: int = 4
    embedding_model: str = ""
    embedding_base_url: str = ""

    # Model gateway.
    model_provider: str = "demo"
    model: str = "demo-1"
    # Taken over when the primary's retries are spent ("" = no fallback).
    fallback_model_provider: str = ""
    fallback_model: str = ""
    model_connect_timeout_s: float = 5.0
    model_first_token_timeout_s: float = 30.0
    model_total_timeout_s: float = 240.0
    demo_token_delay_ms: float = 15.0

    # Tools and the Northwind demo backend they call.
    northwind_url: str = "http://127.0.0.1:8100"
    northwind_port: int = 8100
    tool_timeout_s: float = 5.0
    breaker_failure_threshold: int = 3
    breaker_cooldown_s: float = 10.0
    # How long a proposed action waits for the user's confirmation.
    confirmation_timeout_s: float = 600.0
    # How long a hand-off waits for a support agent's claim before the customer is told and
    # offered an email follow-up (parley/handoffs.py); a tenant sets its own.
    handoff_claim_timeout_s: float = DEFAULT_CLAIM_TIMEOUT_S
    # How long before a card lapses its `confirmation_expiring` warning is shown (a tenant's
    # `confirmation_warning_s` overrides it); shown by the worker's outbox sweep, so up to
    # `outbox_poll_s` later than this. 0: no warning.
    confirmation_warning_s: float = Field(default=60.0, ge=0.0)
    # How long a specialist waits for the user's answer to its question before it ends the
    # turn politely (parley/specialists.py).
    specialist_wait_s: float = 600.0

    # Where a tenant's MCP servers may be (parley/egress.py), checked when a config is saved
    # and when a turn connects: `host:port`, `host` (any port), `*:port`, `*` (any host, any
    # port). A host only `*` covers must resolve to public addresses; loopback, private and
    # link-local ones (the metadata service, the database) only through an entry naming the
    # host. `parley dev` adds its demo backend. JSON in the environment:
    # PARLEY_MCP_ALLOWED_HOSTS='["*:443", "mcp.internal:8443"]'.
    mcp_allowed_hosts: list[str] = ["*"]

    # Skills (parley/skills.py): the catalog, the sandbox that runs them, its wall-clock cap.
    # The workflow's SKILL step allows a little over the cap (workflows/options.py).
    skills_dir: Path = REPO_ROOT / "skills"
    sandbox_bwrap: str = "bwrap"
    # The interpreter skills run with inside the sandbox: the system's, under /usr.
    sandbox_python: str = "/usr/bin/python3"
    # Where each run's scratch folder is made (and removed); the system temp folder if unset.
    sandbox_root: Path | None = None
    sandbox_wall_clock_s: float = Field(default=120.0, gt=0, le=150)

    # Screens: the rules floor always runs; "openai" chains an OpenAI-compatible moderation
    # endpoint after it (OPENAI_BASE_URL / OPENAI_API_KEY).
    screen_provider: str = "rules"
    screen_blocked_input_terms: list[str] = []
    screen_blocked_output_terms: list[str] = []

    # Erasure (parley/erasure.py): a deleted session's rows, and everything derived from them,
    # are erased this long after the delete (0: at once); until then it is only hidden.
    session_erase_grace_s: float = Field(default=60.0, ge=0)
    # The key of the keyed hash an erasure's receipt keeps instead of its subject's ids: with
    # it and the ids an operator finds the receipt (`parley erasure receipt`); without it the
    # receipt names nobody. Outside dev the default is refused: set a secret of your own.
    erasure_receipt_key: str = DEV_ERASURE_RECEIPT_KEY
    # Rows one erasure batch deletes (each batch is one short transaction).
    erasure_batch_rows: int = Field(default=500, ge=1)
    # Where `parley eval capture --feedback` writes its draft conversations (copies of user
    # text): an erasure looks for its subject's drafts here, so the worker and the CLI must
    # agree on it.
    eval_capture_dir: Path = REPO_ROOT / "evals" / "captured"

    # Outbox: turns whose workflow was not started by the API are started by the worker
    # after this many seconds.
    outbox_grace_s: float = 3.0
    outbox_poll_s: float = 2.0
    # How long one step attempt waits for an unreachable database to answer again before it
    # fails and is retried (activities/failures.py): five model-call attempts ride out about
    # a minute of outage with the default.
    store_outage_wait_s: float = 12.0
    # Tests only (api/faults.py, dispatch/outbox.py): the process kills itself (SIGKILL) when
    # it reaches the named point, e.g. `answer_committed` (the API: a specialist's answer
    # committed, not signalled), `turn_claimed` / `context_built` / `turn_started` (a worker:
    # a posted turn's start claimed; its early build stored, the start not asked for; or
    # started and not yet marked). Refused outside dev.
    fault_kill_at: str = ""

    @field_validator("mcp_allowed_hosts")
    @classmethod
    def _entries_parse(cls, entries: list[str]) -> list[str]:
        Allowlist.parse(entries)  # a bad entry stops the process at start, not a turn later
        return entries

    @model_validator(mode="after")
    def _refuse_dev_defaults_outside_dev(self) -> Settings:
        if self.env != "dev" and self.database_url is None:
            raise ValueError("DATABASE_URL must be set outside the dev environment")
        if self.env != "dev" and self.fault_kill_at:
            raise ValueError("PARLEY_FAULT_KILL_AT is for tests in the dev environment only")
        if self.env != "dev" and self.erasure_receipt_key == DEV_ERASURE_RECEIPT_KEY:
            # The key is published here: receipts keyed with it name their subjects to anyone.
            raise ValueError("PARLEY_ERASURE_RECEIPT_KEY must be set to a secret outside dev")
        return self

    @property
    def mcp_allowlist(self) -> Allowlist:
        return Allowlist.parse(self.mcp_allowed_hosts)

    @property
    def has_fallback_model(self) -> bool:
        """Whether a fallback model takes over; turns carry the answer in their input."""
        return bool(self.fallback_model_provider)

    @property
    def retention_defaults(self) -> dict[str, int]:
        return {
            "messages": self.retention_messages_days,
            "prompts": self.retention_prompts_days,
            "summaries": self.retention_summaries_days,
            "memory": self.retention_memory_days,
        }

    @property
    def limits(self) -> Limits:
        return Limits(
            active_turns_per_user=self.max_active_turns_per_user,
            turn_stale_after_s=self.turn_stale_after_s,
            user_per_minute=self.user_requests_per_minute,
            tenant_per_minute=self.tenant_requests_per_minute,
            sessions_per_user_per_day=self.max_sessions_per_user_per_day,
            user_per_day=self.user_daily_messages or None,
        )

    def turn_workflow_url(self, turn_id: str) -> str | None:
        """The turn's workflow in the Temporal UI, or None when no UI address is set."""
        if not self.temporal_ui_url:
            return None
        base = self.temporal_ui_url.rstrip("/")
        workflow = workflow_id_for_turn(turn_id)
        return f"{base}/namespaces/{self.temporal_namespace}/workflows/{workflow}"


@lru_cache
def get_settings() -> Settings:
    return Settings()
