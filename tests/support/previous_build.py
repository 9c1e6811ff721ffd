"""The previous build's code, from git, for replaying the recordings it made.

A turn is pinned to the build it started on (dispatch/deployment.py): while a deploy drains,
workers of the previous build run its turns to their ends with the previous build's code. So
the previous build's recordings are replayed on that code, not on today's: `export` writes the
sources of the commit that last had it (`git archive`) into a folder laid out as the installed
`parley` package (pyproject.toml's `package-dir`, as that commit had it), and `replay` runs
tests/support/replay_build.py in a process whose `parley` is that folder's.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# What the workflow code imports, and the layout that says where each part goes.
SOURCES = ("pyproject.toml", "parley", "workflows", "activities", "store", "gateway", "dispatch")
RUNNER = Path(__file__).with_name("replay_build.py")


def export(commit: str, into: Path) -> Path:
    """The commit's sources under `into`, importable as `parley` with `into` on the path."""
    archived = subprocess.run(
        ["git", "-C", str(REPO), "archive", "--format=tar", commit, "--", *SOURCES],
        capture_output=True,
    )
    if archived.returncode != 0:
        raise RuntimeError(
            f"the previous build's commit {commit} is not in this checkout (a shallow clone "
            f"lacks it; fetch the history): {archived.stderr.decode(errors='replace')}"
        )
    archive = archived.stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    layout = tomllib.loads((into / "pyproject.toml").read_text())
    for package, folder in layout["tool"]["setuptools"]["package-dir"].items():
        parent, _, name = package.rpartition(".")
        if parent == "parley" and (into / folder).is_dir():
            (into / "parley" / name).symlink_to(into / folder, target_is_directory=True)
    return into


def replay(tree: Path, histories: list[Path]) -> dict[str, str]:
    """Each history replayed on the code in `tree`: "ok", or why not, by file name. Raises
    when the process did not import `parley` from `tree`."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run(
        [sys.executable, str(RUNNER), str(tree), *(str(h.resolve()) for h in histories)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tree,
        timeout=300,
    )
    if done.returncode != 0:
        raise RuntimeError(f"the replay process failed:\n{done.stderr[-4000:]}")
    # The SDK's core logs to stdout as well: the runner's answer is its last line.
    return dict(json.loads(done.stdout.strip().splitlines()[-1])["replayed"])
