"""A suite is a folder of YAML files, one conversation each; this module is their schema.

The files are read through PyYAML's node tree, which keeps where every value was written,
so a value the schema refuses is reported with its file and line ("evals/x/a.yaml:12:
turns.2.expect.slots: ..."). A suite with any bad file raises `SuiteError` naming every
problem, before a single conversation runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator


class Strict(BaseModel):
    # A misspelt key is an error, not an expectation silently ignored.
    model_config = ConfigDict(extra="forbid", frozen=True)


class ToolCallSpec(Strict):
    name: str
    # Each argument given must be present with this value (others may be present too).
    args: dict[str, Any] | None = None


class ToolsSpec(Strict):
    called: list[ToolCallSpec] = Field(default_factory=list)
    not_called: list[str] = Field(default_factory=list)
    # No tool other than the `called` ones ran.
    only: bool = False


class ReplySpec(Strict):
    """Facts the reply must state, not its wording."""

    contains: list[str] = Field(default_factory=list)
    not_contains: list[str] = Field(default_factory=list)
    regex: list[str] = Field(default_factory=list)


class ClarificationSpec(Strict):
    # The option labels that must be offered (others may be offered too).
    options: list[str] = Field(default_factory=list)


class ConfirmationSpec(Strict):
    tool: str | None = None
    recipient_masked: str | None = None


class Expect(Strict):
    """What must hold after a step. Absent keys are not checked, except `clarification`:
    a user turn without it must not be answered with a question (over-asking)."""

    # The referents the turn must have resolved, as the session's slots show them.
    slots: dict[str, str | None] | None = None
    clarification: bool | ClarificationSpec | None = None
    tools: ToolsSpec | None = None
    reply: ReplySpec | None = None
    confirmation: ConfirmationSpec | None = None
    # The turn's last event: done, error, cancelled, or confirmation_required.
    ends_with: Literal["done", "error", "cancelled", "confirmation_required"] | None = None
    warning: str | None = None
    citations: list[str] | None = None  # knowledge documents that must be cited
    # The step's `steer` was taken into the running answer (`steered`), not answered apart.
    steered: bool | None = None
    # After the step a case to a person is open: the session was handed to the support team.
    handoff: bool | None = None


class SwitchSpec(Strict):
    """Show version `version` of an earlier step's message (its answer, with `answer`)."""

    step: int = Field(ge=1)
    version: int = Field(ge=1)
    answer: bool = False


class Step(Strict):
    """One user action: a message (`say`; with `edit: <step>`, a new version of that earlier
    step's message), an answer to the pending proposal, an earlier step's answer written
    again (`regenerate: <step>`), or another version shown (`switch`)."""

    say: str | None = None
    edit: int | None = Field(default=None, ge=1)
    # Sent with `"mode": "steer"` once the answer to `say` streams its first words: the
    # step's expectations are then about the one answer that takes it into account.
    steer: str | None = Field(default=None, min_length=1)
    confirm: bool = False
    decline: bool = False
    regenerate: int | None = Field(default=None, ge=1)
    switch: SwitchSpec | None = None
    # Start a new session of the same user before this message (memory across sessions).
    new_session: bool = False
    expect: Expect = Field(default_factory=Expect)

    @model_validator(mode="after")
    def _one_action(self) -> Step:
        if self.edit is not None and self.say is None:
            raise ValueError("`edit` goes with a `say` step: its new text")
        actions = [self.say is not None, self.confirm, self.decline]
        actions += [self.regenerate is not None, self.switch is not None]
        if actions.count(True) != 1:
            raise ValueError(
                "a step has exactly one of `say`, `confirm: true`, `decline: true`, "
                "`regenerate`, `switch`"
            )
        if self.new_session and (self.say is None or self.edit is not None):
            raise ValueError("`new_session` goes with a `say` step")
        if self.steer is not None and (self.say is None or self.edit is not None):
            raise ValueError("`steer` goes with a `say` step (not an edit)")
        return self

    def earlier(self) -> int | None:
        """The earlier step this one refers to (an edit, a regenerate, a switch)."""
        return self.edit or self.regenerate or (self.switch.step if self.switch else None)


class Backend(Strict):
    """The demo backend's state for the run (ignored when no demo backend is reachable)."""

    today: str | None = None
    faults: dict[str, Any] | None = None
    # An order's free-text carrier note, by order id (where tool-output injections go).
    carrier_notes: dict[str, str] | None = None


class Invariants(Strict):
    # No write without the user's confirmation of exactly that action: always checked.
    max_emails: int | None = Field(default=None, ge=0)


class Conversation(Strict):
    name: str
    tenant: str = "northwind"
    user: str
    tags: list[str] = Field(default_factory=list)
    # `draft`: captured from feedback, not yet labelled by a person; skipped by runs.
    status: Literal["ready", "draft"] = "ready"
    # Where a captured draft came from (feedback message, session, turn): what an erasure
    # of that user or session looks for.
    source: dict[str, str] | None = None
    backend: Backend | None = None
    invariants: Invariants = Field(default_factory=Invariants)
    steps: list[Step] = Field(min_length=1)

    @model_validator(mode="after")
    def _confirm_follows_a_proposal(self) -> Conversation:
        for number, step in enumerate(self.steps):
            if (step.confirm or step.decline) and number == 0:
                raise ValueError("the first step cannot confirm or decline")
            earlier = step.earlier()
            if earlier is not None and earlier > number:
                raise ValueError(f"step {number + 1} refers to step {earlier}, not an earlier one")
        return self


class SuiteError(Exception):
    """One or more suite files are malformed; the message names each file and line."""


class Loaded(BaseModel):
    path: str
    conversation: Conversation


def load_suite(folder: Path) -> list[Loaded]:
    """Every `*.yaml` of `folder`, validated; raises `SuiteError` listing every problem."""
    if not folder.is_dir():
        raise SuiteError(f"{folder}: not a folder of conversation files")
    files = sorted([*folder.glob("*.yaml"), *folder.glob("*.yml")])
    if not files:
        raise SuiteError(f"{folder}: no .yaml files")
    loaded: list[Loaded] = []
    problems: list[str] = []
    for path in files:
        try:
            loaded.append(Loaded(path=str(path), conversation=load_conversation(path)))
        except SuiteError as exc:
            problems.append(str(exc))
    if problems:
        raise SuiteError("\n".join(problems))
    return loaded


def load_conversation(path: Path) -> Conversation:
    text = path.read_text(encoding="utf-8")
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else 1
        raise SuiteError(f"{path}:{line}: not valid YAML: {exc.problem or exc}") from None
    if node is None:
        raise SuiteError(f"{path}:1: empty file")
    lines: dict[tuple[str | int, ...], int] = {}
    data = _plain(node, (), lines)
    try:
        return Conversation.model_validate(data)
    except ValidationError as exc:
        raise SuiteError(
            "\n".join(_located(path, error, lines) for error in exc.errors())
        ) from None


def _plain(
    node: yaml.Node, at: tuple[str | int, ...], lines: dict[tuple[str | int, ...], int]
) -> Any:
    """The node as plain data, recording the line of every value by its path."""
    lines[at] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        out: dict[str, Any] = {}
        for key, value in node.value:
            name = str(yaml.safe_load(yaml.serialize(key)))
            lines[(*at, name)] = key.start_mark.line + 1
            out[name] = _plain(value, (*at, name), lines)
            lines[(*at, name)] = key.start_mark.line + 1
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_plain(item, (*at, index), lines) for index, item in enumerate(node.value)]
    # A scalar: let the safe constructor type it (numbers, booleans, dates as text).
    value = yaml.safe_load(yaml.serialize(node))
    return value.isoformat() if hasattr(value, "isoformat") else value


def _located(path: Path, error: Any, lines: dict[tuple[str | int, ...], int]) -> str:
    loc = tuple(part for part in error["loc"] if not _is_union_tag(part))
    line = 1
    for end in range(len(loc), -1, -1):
        if loc[:end] in lines:
            line = lines[loc[:end]]
            break
    where = ".".join(str(part) for part in loc) or "(file)"
    return f"{path}:{line}: {where}: {error['msg']}"


def _is_union_tag(part: Any) -> bool:
    # pydantic names the branch of a union it tried (`bool`, `ClarificationSpec`) in `loc`.
    return isinstance(part, str) and (part[:1].isupper() or part in ("bool", "str", "int"))
