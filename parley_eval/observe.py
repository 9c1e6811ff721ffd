"""What a run saw, as plain data: one record per step and per conversation. The runner
fills these from the API; the scorer (`score.py`) reads only these, so it stays pure and
is unit-tested on hand-made records."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class ToolSeen:
    name: str
    arguments: Any = None  # from the assistant message's tool calls (None: not asked by a model)
    status: str | None = None  # from the `tool` end event: ok, error, refused


@dataclass
class StepSeen:
    number: int
    kind: str  # say, edit, regenerate, switch, confirm, decline
    text: str
    session_id: str
    turn_id: str | None = None
    events: list[str] = field(default_factory=list)
    ends_with: str | None = None
    reply: str = ""
    tools: list[ToolSeen] = field(default_factory=list)
    clarification: dict[str, Any] | None = None  # question, options (labels)
    action: dict[str, Any] | None = None  # the confirmation card's action
    resolved: list[str] = field(default_factory=list)  # confirmation_resolved statuses
    warnings: list[str] = field(default_factory=list)
    citations: list[str] = field(default_factory=list)  # cited document ids
    error: str | None = None
    slots: dict[str, Any] = field(default_factory=dict)
    first_delta_s: float | None = None
    end_s: float | None = None
    workflow_url: str | None = None
    trace: list[dict[str, Any]] = field(default_factory=list)  # the turn's spans (operators)
    # The user's message the step stored, and the answer its turn ended with (what a later
    # `edit`, `regenerate` or `switch` step names).
    message_id: str | None = None
    answer_id: str | None = None
    # A step with a `steer`: taken into the running answer (True), or answered as a turn of
    # its own because that answer had ended (False); None without one.
    steered: bool | None = None
    # Whether a case to a person was open after the step.
    handoff: bool = False

    @property
    def model_turn(self) -> bool:
        """A step whose turn the model answers from the user's words (not a card's answer,
        not a switch of versions)."""
        return self.kind in ("say", "edit", "regenerate")

    @property
    def turn_type(self) -> str:
        """no_tool, tool or confirmation: the latency classes of the issue (a switch runs no
        turn: none of them)."""
        if self.kind == "switch":
            return "switch"
        if not self.model_turn or self.action is not None:
            return "confirmation"
        return "tool" if any(t.status is not None for t in self.tools) else "no_tool"


@dataclass
class ConversationSeen:
    name: str
    path: str
    steps: list[StepSeen] = field(default_factory=list)
    confirmed_actions: list[str] = field(default_factory=list)
    # Emails the backend accepted while the conversation ran (None: no backend to ask).
    emails: list[dict[str, Any]] | None = None
    tokens_in: int | None = None
    tokens_out: int | None = None
    # What its model calls cost, USD as a decimal string, from the ledger (None: not read).
    cost_usd: str | None = None
    crashed: str | None = None  # the run could not go on (the API refused, a stream broke)
