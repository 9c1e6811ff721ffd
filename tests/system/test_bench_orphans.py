"""A bench that is killed leaves no process behind (bench/stack.py `guard`, launch/lifeline.py).

`make bench` starts embedded PostgreSQL (a daemon: nobody's child), a Temporal dev server
(started by the SDK, in the bench's own process group) and Python children (worker, API,
baseline, demo backend). A bench killed by SIGTERM or SIGKILL runs no teardown; its guard must
take all of them along.

The parent here is the bench's own launcher code with a small part of the stack, one process
of each kind, so the test needs no migrations, seeding or worker: `start_postgres`,
`start_temporal` and one `spawn`ed child (the baseline server), as `running_stack` starts them.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.support.stack import REPO, free_port

# Started as the bench starts them, then held until killed.
PARENT = """
import asyncio, os, sys
from pathlib import Path
from bench.stack import spawn, start_postgres, start_temporal

async def main():
    pg, _ = await start_postgres(Path(sys.argv[1]))
    # Held: the SDK stops a dev server whose environment is dropped.
    temporal = await start_temporal(eager=False, log_name="temporal-orphans")
    port = sys.argv[2]
    baseline = ["-m", "bench.baseline", "--port", port, "--token-delay-ms", "5"]
    spawn("baseline-orphans", baseline, dict(os.environ))
    print("ready", pg.pid, flush=True)
    await asyncio.sleep(600)

asyncio.run(main())
"""
START_S = 120  # PostgreSQL's initdb and the dev server on a busy 2-core machine
GONE_S = 10


def gone(process: psutil.Process) -> bool:
    try:
        return not process.is_running() or process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def wait_for(condition: object, timeout: float, what: object) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, what() if callable(what) else what
        time.sleep(0.05)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("kill", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_a_killed_bench_leaves_no_process_of_its_stack(
    tmp_path: Path, kill: signal.Signals
) -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, str(tmp_path), str(free_port())],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=(tmp_path / "parent.log").open("w"),
        text=True,
        start_new_session=True,  # the test's own group stays out of it
    )
    stack: list[psutil.Process] = []
    try:
        assert parent.stdout is not None
        line = parent.stdout.readline()  # blocks until ready (or the parent died)
        assert line.startswith("ready"), (line, (tmp_path / "parent.log").read_text()[-3000:])
        postmaster = psutil.Process(int(line.split()[1]))
        stack = [
            *psutil.Process(parent.pid).children(recursive=True),
            postmaster,
            *postmaster.children(recursive=True),
        ]
        names = {p.pid: " ".join(p.cmdline()) for p in stack}
        for kind in ("parley.launch.lifeline", "start-dev", "bench.baseline", "postgres"):
            assert any(kind in n for n in names.values()), (kind, names)

        os.kill(parent.pid, kill)
        parent.wait(10)
        wait_for(
            lambda: all(gone(p) for p in stack),
            GONE_S,
            lambda: [names[p.pid] for p in stack if not gone(p)],
        )
    finally:
        if parent.poll() is None:
            os.killpg(parent.pid, signal.SIGKILL)
        for process in stack:  # what a failed run leaves, so the next test starts clean
            if not gone(process):
                process.kill()
