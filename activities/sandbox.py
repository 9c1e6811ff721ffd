"""The ephemeral sandbox a turn's skills run in: bubblewrap, one scratch folder per run.

`Sandbox.run` acquires a scratch folder named for the turn and the call, runs the skill's
entry point under bubblewrap (the command line is `parley.skills.bwrap_argv`; it sets the CPU
and memory rlimits inside) under a wall clock, collects what the skill wrote to its output
folder, and in a `finally`, whatever happened (a failure, the wall clock, the activity
cancelled), kills the sandbox's whole process group and removes the scratch folder. The
workflow runs a turn's skill calls one at a time, so a turn never holds two sandboxes.

Errors::

    SkillRunError            the skill did not produce its result (`code` says why)
      SandboxUnavailable     no sandbox can be had here (no bwrap, or it cannot unshare)

Both reach the model as a structured tool error and the client as a `warning`.

A worker killed outright cannot run its `finally`: bubblewrap dies with it
(`--die-with-parent`), a retried attempt of the same call starts by removing its own
folder, and the first skill run of each worker sweeps folders older than any run could be.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from parley.skills import (
    INPUT_FILE,
    MAX_ARTIFACT_BYTES,
    MAX_ARTIFACTS,
    OUTPUT_DIR,
    SANDBOX_UNAVAILABLE,
    SKILL_FAILED,
    SKILL_TIMED_OUT,
    SandboxPaths,
    SkillLimits,
    SkillManifest,
    artifact_content_type,
    bwrap_argv,
)

# Kept of a skill's stdout (its summary for the model) and stderr (for the log).
MAX_OUTPUT_CHARS = 2000
# The name prefix of every scratch folder, so leftovers are recognisable (and tests can look).
SCRATCH_PREFIX = "parley-sandbox-"
# A scratch folder older than this outlived its run (the longest is the SKILL step's 180 s).
STALE_AFTER_S = 600.0


class SkillRunError(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class SandboxUnavailable(SkillRunError):
    def __init__(self, message: str) -> None:
        super().__init__(SANDBOX_UNAVAILABLE, message)


@dataclass(frozen=True)
class Produced:
    """A file the skill wrote to its output folder."""

    name: str
    content_type: str
    content: bytes


@dataclass(frozen=True)
class SkillRun:
    summary: str  # the skill's stdout, cut short
    files: list[Produced]


class Sandbox:
    """Runs skills under bubblewrap; built once per worker (`worker.py`)."""

    def __init__(self, *, bwrap: str, root: Path, python: str = "/usr/bin/python3") -> None:
        self._bwrap = bwrap
        self._root = root
        self._python = python
        self._usable: bool | None = None  # probed once: can bwrap unshare here?

    async def available(self) -> bool:
        if self._usable is None:
            self.sweep()
            self._usable = await self._probe()
        return self._usable

    def sweep(self, *, older_than_s: float = STALE_AFTER_S) -> list[str]:
        """Remove scratch folders left by a worker killed mid-run (its `finally` never ran;
        bubblewrap died with it). Only folders older than any run could be are touched, so a
        live run on another worker sharing the folder keeps its own."""
        removed: list[str] = []
        if not self._root.is_dir():
            return removed
        cutoff = time.time() - older_than_s
        for folder in self._root.glob(f"{SCRATCH_PREFIX}*"):
            with contextlib.suppress(OSError):
                if folder.is_dir() and folder.stat().st_mtime < cutoff:
                    shutil.rmtree(folder)
                    removed.append(folder.name)
        return removed

    async def _probe(self) -> bool:
        binary = shutil.which(self._bwrap)
        if binary is None or not Path(self._python).exists():
            return False
        try:
            proc = await asyncio.create_subprocess_exec(
                binary, "--unshare-all", "--die-with-parent", "--ro-bind", "/usr", "/usr",
                "--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64",
                "--symlink", "usr/bin", "/bin", "--", self._python, "-c", "pass",
                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
            )  # fmt: skip
            return await asyncio.wait_for(proc.wait(), timeout=30) == 0
        except (OSError, TimeoutError):
            return False

    async def run(
        self,
        *,
        run_id: str,
        skill_dir: Path,
        manifest: SkillManifest,
        limits: SkillLimits,
        payload: dict[str, Any],
    ) -> SkillRun:
        """Run one skill in a fresh sandbox and return what it produced; the sandbox is gone
        when this returns or raises."""
        if not await self.available():
            raise SandboxUnavailable("no sandbox can be had on this worker (bubblewrap)")
        self._root.mkdir(parents=True, exist_ok=True)
        scratch = self._root / f"{SCRATCH_PREFIX}{run_id}"
        shutil.rmtree(scratch, ignore_errors=True)  # an earlier attempt's leftovers
        proc: asyncio.subprocess.Process | None = None
        try:
            (scratch / OUTPUT_DIR).mkdir(parents=True)
            (scratch / INPUT_FILE).write_text(json.dumps(payload))
            paths = SandboxPaths(self._bwrap, self._python, str(skill_dir), str(scratch), run_id)
            proc = await asyncio.create_subprocess_exec(
                *bwrap_argv(paths, manifest, limits),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                start_new_session=True,  # its own process group, killed as one
            )
            try:
                out, err = await asyncio.wait_for(proc.communicate(), limits.wall_clock_s)
            except TimeoutError:
                raise SkillRunError(
                    SKILL_TIMED_OUT, f"the skill ran past its {limits.wall_clock_s:g} s limit"
                ) from None
            if proc.returncode != 0:
                tail = err.decode(errors="replace").strip().splitlines()[-1:] or [""]
                raise SkillRunError(
                    SKILL_FAILED, f"the skill exited with {proc.returncode}: {tail[0][:300]}"
                )
            summary = out.decode(errors="replace")[:MAX_OUTPUT_CHARS]
            return SkillRun(summary, _collect(scratch / OUTPUT_DIR))
        finally:
            if proc is not None:
                await _release(proc)
            shutil.rmtree(scratch, ignore_errors=True)


async def _release(proc: asyncio.subprocess.Process) -> None:
    """Kill the sandbox's process group (bubblewrap and all it started) and reap it."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        await proc.wait()


def _collect(out: Path) -> list[Produced]:
    """The files the skill wrote, if each is a kind and size it may return."""
    found = sorted(p for p in out.iterdir() if p.is_file() and not p.is_symlink())
    if len(found) > MAX_ARTIFACTS:
        raise SkillRunError(SKILL_FAILED, f"the skill wrote more than {MAX_ARTIFACTS} files")
    produced: list[Produced] = []
    for path in found:
        content_type = artifact_content_type(path.name)
        if content_type is None:
            raise SkillRunError(SKILL_FAILED, f"the skill wrote a file it may not: {path.name}")
        if path.stat().st_size > MAX_ARTIFACT_BYTES:
            raise SkillRunError(SKILL_FAILED, f"the skill wrote too large a file: {path.name}")
        produced.append(Produced(path.name, content_type, path.read_bytes()))
    return produced
