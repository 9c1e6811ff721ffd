"""`parley dev` run as a user runs it, for the tests that drive it: on free ports with a
data folder of its own, its banner read, its output kept, and a user's script that creates
a token the moment `/healthz` answers (tests/system/test_make_run.py,
tests/system/test_dev_restarts.py)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import httpx
import psutil

from parley.tls import httpx_verified
from tests.support.stack import REPO, free_port

CLI = [sys.executable, "-m", "parley.launch.cli"]


def port_is_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


@dataclass
class DevRun:
    process: subprocess.Popen[str]
    env: dict[str, str]
    data_dir: Path
    ports: dict[str, int]
    banner: list[str]
    log: Path
    output: list[str] = field(default_factory=list)
    # What a script that waits for `/healthz` and then runs `parley token create` met.
    early: dict[str, object] = field(default_factory=dict)

    @property
    def api(self) -> str:
        return f"http://127.0.0.1:{self.ports['api']}"

    @property
    def priya_token(self) -> str:
        line = next(line for line in self.banner if "Token for Priya" in line)
        return line.rsplit(" ", 1)[-1]

    def workers(self) -> list[psutil.Process]:
        """The supervisor's live worker children (`python -m parley.launch.cli worker`)."""
        return [
            child
            for child in psutil.Process(self.process.pid).children()
            if child.is_running()
            and child.status() != psutil.STATUS_ZOMBIE
            and child.cmdline()[-1:] == ["worker"]
        ]

    def child_pid(self, command: str) -> int:
        children = psutil.Process(self.process.pid).children()
        found = [c.pid for c in children if c.cmdline()[-1:] == [command]]
        assert found, f"no `{command}` child of parley dev\n{self.story()}"
        return found[0]

    def story(self) -> str:
        """What the run said (the end of its stderr, where the supervisor logs every death
        and restart, and of its stdout): a failed test shows why, not only that."""
        stderr = self.log.read_text(errors="replace").splitlines()[-60:]
        return "\n".join(["-- stderr (end):", *stderr, "-- stdout (end):", *self.output[-20:]])


def start_dev(tmp_path: Path, **settings: str) -> DevRun:
    """`settings`: environment variables for the run besides its ports and data folder (a
    test's own pace, never what `make run` gives a user)."""
    ports = {name: free_port() for name in ("api", "temporal", "ui", "backend", "metrics")}
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("DATABASE_URL", "TEMPORAL_ADDRESS", "PARLEY_NORTHWIND_URL")
    }
    env.update(
        PARLEY_DATA_DIR=str(tmp_path / "data"),
        PARLEY_API_PORT=str(ports["api"]),
        PARLEY_DEV_TEMPORAL_PORT=str(ports["temporal"]),
        PARLEY_TEMPORAL_UI_PORT=str(ports["ui"]),
        PARLEY_NORTHWIND_PORT=str(ports["backend"]),
        PARLEY_WORKER_METRICS_PORT=str(ports["metrics"]),
        # Slow enough tokens that a kill lands mid-answer.
        PARLEY_DEMO_TOKEN_DELAY_MS="40",
    )
    env.update(settings)
    log = tmp_path / "dev-stderr.log"
    with log.open("w") as stderr:  # the child writes to its own copy of the descriptor
        dev = subprocess.Popen(
            [*CLI, "dev"],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            start_new_session=True,
        )
    run = DevRun(dev, env, tmp_path / "data", ports, [], log)
    early = threading.Thread(target=_script_at_first_healthz, args=(run,), daemon=True)
    early.start()
    assert dev.stdout is not None
    deadline = time.monotonic() + 120
    for line in dev.stdout:
        run.banner.append(line.rstrip("\n"))
        if line.strip().startswith("curl -sN"):
            break
        assert time.monotonic() < deadline, "\n".join(run.banner)
    # Keep reading, so a chatty child never blocks on a full pipe; closed at its end.
    threading.Thread(target=_read_rest, args=(dev.stdout, run.output), daemon=True).start()
    early.join(60)
    return run


@contextmanager
def dev_running(tmp_path: Path, **settings: str) -> Iterator[DevRun]:
    """`parley dev` started in `tmp_path` (with `settings` in its environment), stopped with
    Ctrl-C on leaving (killed, its whole process group, if it is still running a minute
    later)."""
    run = start_dev(tmp_path, **settings)
    try:
        yield run
    finally:
        if run.process.poll() is None:
            run.process.send_signal(signal.SIGINT)
            try:
                run.process.wait(60)
            finally:
                if run.process.poll() is None:
                    os.killpg(run.process.pid, signal.SIGKILL)


def _read_rest(stdout: IO[str], into: list[str]) -> None:
    with stdout:
        into.extend(stdout)


def _script_at_first_healthz(run: DevRun) -> None:
    """A user's script: poll the API's `/healthz`, and the moment it answers, create a token
    with the CLI (which finds the database through `dev.json` only)."""
    deadline = time.monotonic() + 120
    with httpx.Client(timeout=1, verify=httpx_verified()) as http:  # one client for every poll
        while time.monotonic() < deadline and run.process.poll() is None:
            try:
                if http.get(f"{run.api}/healthz").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
    run.early["dev_json"] = (run.data_dir / "dev.json").exists()
    run.early["token"] = subprocess.run(
        [*CLI, "token", "create", "--tenant", "northwind", "--user", "cust_3301"],
        cwd=REPO,
        env=run.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
