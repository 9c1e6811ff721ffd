"""The embedded PostgreSQL a process started and stopped leaves nothing where it ran: a bench
deletes its temp folder after stopping the server, and nothing makes it again at exit."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support.stack import REPO

# Starts a server in the folder, stops it, deletes the folder, exits (as bench/stack.py's
# `running_stack` ends).
USE_AND_DELETE = """
import shutil, sys
from pathlib import Path
from parley.store.embedded import EmbeddedPostgres

folder = Path(sys.argv[1])
pg = EmbeddedPostgres(folder / "pg" / "data")
pg.start()
pg.stop()
shutil.rmtree(folder)
"""


def test_a_stopped_servers_deleted_folder_stays_deleted_after_exit(tmp_path: Path) -> None:
    folder = tmp_path / "stack"
    # As a fresh shell has it: no runtime folder set, so the server's goes inside `folder`.
    env = {k: v for k, v in os.environ.items() if k != "XDG_RUNTIME_DIR"}
    done = subprocess.run(
        [sys.executable, "-c", USE_AND_DELETE, str(folder)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert not folder.exists(), sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))
