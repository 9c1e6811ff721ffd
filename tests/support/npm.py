"""Node packages for the tests that run JavaScript, as a committed lock pins them: `npm ci`
into a cache folder named by the lock's digest, once per lock (as the web tier needs its
browser installed). A machine that cannot reach the registry fails with npm's own words; it
never skips."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest

CACHE = Path(os.environ.get("PARLEY_NODE_CACHE", Path.home() / ".cache" / "parley-node"))


def installed(package: Path) -> Path:
    """A folder whose `node_modules` holds what `package`'s package.json and lock pin."""
    if shutil.which("npm") is None or shutil.which("node") is None:
        pytest.fail("this test needs node and npm on PATH (Debian: apt-get install nodejs npm)")
    pinned = (package / "package.json").read_bytes() + (package / "package-lock.json").read_bytes()
    folder = CACHE / hashlib.sha256(pinned).hexdigest()[:16]
    if (folder / "node_modules" / ".package-lock.json").exists():
        return folder
    # Installed beside it, then renamed: a run installing at the same time, or one killed
    # mid-install, never leaves a half-filled folder behind.
    staging = CACHE / f"{folder.name}.{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    for name in ("package.json", "package-lock.json"):
        shutil.copy(package / name, staging / name)
    done = subprocess.run(
        ["npm", "ci", "--no-audit", "--no-fund", "--ignore-scripts"],
        cwd=staging,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if done.returncode != 0:
        pytest.fail(
            "npm ci could not install the pinned packages (is the npm registry reachable?):\n"
            + done.stderr[-3000:]
        )
    try:
        staging.rename(folder)
    except OSError:  # another run installed it first
        shutil.rmtree(staging, ignore_errors=True)
    return folder
