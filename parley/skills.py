"""Skills: file-based programs a turn may run in an ephemeral sandbox of its own (pure rules).

A skill is a folder of the catalog (`skills/<name>/`) holding a `manifest.json` (name,
description, the JSON schema of the arguments the model may give, the entry point, the data
the server supplies, limits) and its Python code. The model asks for one through the
`run_skill` tool, offered only when the tenant enables skills (`TenantConfig.skills`); the
server validates the arguments, puts the customer's data beside them (taken with the
session's identity, never from the model) and runs the entry point with the system Python
inside bubblewrap: no network, the skill read-only, a scratch folder as the only writable
place, CPU, memory and wall-clock limits. What the skill writes to its output folder comes
back as files stored with the session and announced as `artifact` events.

The I/O (the catalog on disk, the sandbox process, the stored files) is activities/sandbox.py
and activities/skills.py; this module holds the shapes and the rules they follow.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import date
from pathlib import PurePosixPath
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from parley.contracts import WarningCode
from parley.result_sets import NeedsToday, date_range

RUN_SKILL = "run_skill"
RUN_SKILL_LABEL = "Running a skill…"

# Error codes a failed skill call reaches the model with (and the warning the client gets).
SANDBOX_UNAVAILABLE = WarningCode.sandbox_unavailable
SKILL_FAILED = WarningCode.skill_failed
SKILL_TIMED_OUT = WarningCode.skill_timed_out

# What a skill may hand back: a few small files with plain names.
MAX_ARTIFACTS = 4
MAX_ARTIFACT_BYTES = 5 * 1024 * 1024
ARTIFACT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
CONTENT_TYPES = {
    ".png": "image/png",
    ".csv": "text/csv",
    ".txt": "text/plain",
    ".json": "application/json",
    ".svg": "image/svg+xml",
}
# Inside the sandbox: where the skill, its scratch folder and its output are mounted.
SKILL_MOUNT = "/skill"
WORK_MOUNT = "/work"
INPUT_FILE = "input.json"
# Set inside the sandbox to the run's id (turn and call), so an operator (or a test) can tell
# whose a process is from its environment.
RUN_ENV = "PARLEY_SANDBOX_RUN"
OUTPUT_DIR = "out"


class SkillLimits(BaseModel):
    model_config = ConfigDict(extra="forbid")

    cpu_s: int = Field(default=10, ge=1, le=600)
    memory_mb: int = Field(default=256, ge=32, le=4096)
    wall_clock_s: float = Field(default=120, gt=0, le=600)


class SkillManifest(BaseModel):
    """`skills/<name>/manifest.json`."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[a-z][a-z0-9_]{0,63}$")
    description: str = Field(min_length=1, max_length=500)
    entry: str = Field(default="main.py", pattern=r"^[A-Za-z0-9_][A-Za-z0-9_./-]*\.py$")
    # The customer's data the server puts beside the arguments; "orders": their orders placed
    # in the arguments' `month` (see `month_range`).
    data: Literal["none", "orders"] = "none"
    # Words in a customer's message that ask for what the skill does ("chart"); `run_skill`
    # is offered to a turn only when its message has one or names the skill
    # (parley/tool_offer.py). Empty: offered on every turn.
    offer_when: list[Annotated[str, Field(pattern=r"^[A-Za-z][A-Za-z -]{1,39}$")]] = Field(
        default_factory=list, max_length=20
    )
    input_schema: dict[str, Any] = Field(default_factory=lambda: {"type": "object"})
    limits: SkillLimits = Field(default_factory=SkillLimits)


class RunSkillArgs(BaseModel):
    """What the model asks for: a skill by name and its arguments (checked against the
    skill's `input_schema` by the executor)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    skill: str = Field(min_length=1, max_length=64)
    arguments: dict[str, Any] = Field(default_factory=dict)


def run_skill_schema(manifests: list[SkillManifest]) -> dict[str, Any]:
    """The `run_skill` tool as the model sees it: one enum of the enabled skills, each
    described, so the model picks a skill it may run."""
    described = "; ".join(f"{m.name}: {m.description}" for m in manifests)
    return {
        "name": RUN_SKILL,
        "description": (
            "Run one of the enabled skills in a sandbox; files it produces are shown to the "
            f"customer. Skills: {described}"
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "skill": {"type": "string", "enum": [m.name for m in manifests]},
                "arguments": {"type": "object", "description": "the skill's arguments"},
            },
            "required": ["skill"],
            "additionalProperties": False,
        },
    }


_YEAR_MONTH = re.compile(r"^(\d{4})-(\d{2})$")


def month_range(month: str, today: date | None) -> tuple[date, date] | None:
    """The first and last day of the month an argument names: `YYYY-MM`, or a month name
    meaning the latest such month that has begun by `today` (the backend's clock)."""
    exact = _YEAR_MONTH.match(month.strip())
    if exact:
        year, number = int(exact.group(1)), int(exact.group(2))
        if not 1 <= number <= 12:
            return None
        first = date(year, number, 1)
        following = date(year + number // 12, number % 12 + 1, 1)
        return first, date.fromordinal(following.toordinal() - 1)
    try:
        return date_range(f"in {month.strip()}", today)
    except NeedsToday:
        return None


def effective_limits(manifest: SkillLimits, *, wall_clock_cap_s: float) -> SkillLimits:
    """The manifest's limits, the wall clock never over the deployment's cap."""
    return manifest.model_copy(
        update={"wall_clock_s": min(manifest.wall_clock_s, wall_clock_cap_s)}
    )


def artifact_content_type(name: str) -> str | None:
    """The content type of a file a skill may return; None for a name or kind it may not."""
    if not ARTIFACT_NAME.match(name) or name.startswith("."):
        return None
    return CONTENT_TYPES.get(PurePosixPath(name).suffix.lower())


@dataclass(frozen=True)
class SandboxPaths:
    """Host paths of one sandboxed run."""

    bwrap: str
    python: str  # the system interpreter, bound read-only with /usr
    skill_dir: str
    scratch: str  # the run's own folder: input.json in, out/ written by the skill
    run_id: str


# Run inside the sandbox before any skill code: CPU seconds, address space and no core
# dumps as hard limits the skill cannot raise, then the entry point as `__main__` with
# `argv` = [entry, input, output folder]. (Set here rather than in a `preexec_fn`, which is
# not safe in the worker's threaded process.)
LAUNCHER = (
    "import resource as r, runpy, sys; "
    "cpu, memory = int(sys.argv[1]), int(sys.argv[2]); "
    "r.setrlimit(r.RLIMIT_CPU, (cpu, cpu)); "
    "r.setrlimit(r.RLIMIT_AS, (memory, memory)); "
    "r.setrlimit(r.RLIMIT_CORE, (0, 0)); "
    "sys.argv = sys.argv[3:]; "
    "runpy.run_path(sys.argv[0], run_name='__main__')"
)


def bwrap_argv(paths: SandboxPaths, manifest: SkillManifest, limits: SkillLimits) -> list[str]:
    """The bubblewrap command line of one skill run: every namespace unshared (no network:
    only a loopback that is down), the system's /usr read-only, the skill read-only at
    /skill, the scratch folder the only writable mount at /work, a fresh /tmp, no environment
    from the worker, the sandbox dying with its parent, and `limits` applied by `LAUNCHER`."""
    return [
        paths.bwrap,
        "--unshare-all",
        "--die-with-parent",
        "--new-session",
        "--clearenv",
        "--setenv", "PATH", "/usr/bin:/bin",
        "--setenv", "HOME", WORK_MOUNT,
        "--setenv", "PYTHONDONTWRITEBYTECODE", "1",
        "--setenv", RUN_ENV, paths.run_id,
        "--ro-bind", "/usr", "/usr",
        "--symlink", "usr/bin", "/bin",
        "--symlink", "usr/lib", "/lib",
        "--symlink", "usr/lib64", "/lib64",
        "--ro-bind-try", "/etc/alternatives", "/etc/alternatives",
        "--proc", "/proc",
        "--dev", "/dev",
        "--tmpfs", "/tmp",
        "--ro-bind", paths.skill_dir, SKILL_MOUNT,
        "--bind", paths.scratch, WORK_MOUNT,
        "--chdir", WORK_MOUNT,
        "--",
        paths.python, "-I", "-S", "-c", LAUNCHER,
        str(limits.cpu_s), str(limits.memory_mb * 1024 * 1024),
        f"{SKILL_MOUNT}/{manifest.entry}",
        f"{WORK_MOUNT}/{INPUT_FILE}",
        f"{WORK_MOUNT}/{OUTPUT_DIR}",
    ]  # fmt: skip
