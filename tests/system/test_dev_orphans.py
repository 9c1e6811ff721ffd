"""Issue 30, items 8 and 9 (acceptance 6): `parley dev` leaves nothing behind and says only
what matters.

- `kill -9` of the supervisor itself: within 5 s no process of its stack is left (its
  children, the embedded PostgreSQL server `pg_ctl` started as a daemon, the watchman), its
  ports are free, and the next start in the same data folder comes up and answers.
- The output of a run, a turn that calls the demo MCP server included, has no MCP SDK or
  alembic plugin lines, no platformdirs warning and no Temporal dev-server warnings; Ctrl-C
  prints the ordered shutdown.
- A start that finds a port taken stops at once and names the process holding it.

Runs `parley dev` as `make run` does, on free ports with a data folder of its own.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

from tests.support.client import ParleyClient
from tests.support.stack import REPO, free_port

CLI = [sys.executable, "-m", "parley.launch.cli"]
START_S = 180  # a cold start on a busy 2-core machine
# What must not appear in a run's output (stdout and stderr).
NOISE = (
    "alembic.runtime.plugins",
    "RuntimeDirWarning",
    "XDG_RUNTIME_DIR",
    " INFO mcp.",
    " INFO httpx2 ",
    "Processing request of type",
    "level=WARN",  # the Temporal dev server's own log lines
)
SHUTDOWN = [
    "Stopping Parley…",
    "  api stopped",
    "  worker-1 stopped",
    "  demo-backend stopped",
    "  temporal stopped",
    "  PostgreSQL stopped",
    "Parley stopped.",
]


@dataclass
class Dev:
    process: subprocess.Popen[str]
    ports: dict[str, int]
    data_dir: Path
    stderr: Path
    output: list[str] = field(default_factory=list)

    @property
    def api(self) -> str:
        return f"http://127.0.0.1:{self.ports['api']}"

    @property
    def token(self) -> str:
        line = next(line for line in self.output if "Token for Priya" in line)
        return line.rsplit(" ", 1)[-1]

    def everything(self) -> str:
        return "\n".join(self.output) + "\n" + self.stderr.read_text(errors="replace")


def dev_env(data_dir: Path, ports: dict[str, int]) -> dict[str, str]:
    env = {
        key: value
        for key, value in os.environ.items()
        if key
        not in ("DATABASE_URL", "TEMPORAL_ADDRESS", "PARLEY_NORTHWIND_URL", "XDG_RUNTIME_DIR")
    }
    env.update(
        PARLEY_DATA_DIR=str(data_dir),
        PARLEY_API_PORT=str(ports["api"]),
        PARLEY_DEV_TEMPORAL_PORT=str(ports["temporal"]),
        PARLEY_TEMPORAL_UI_PORT=str(ports["ui"]),
        PARLEY_NORTHWIND_PORT=str(ports["backend"]),
        PARLEY_WORKER_METRICS_PORT=str(ports["metrics"]),
    )
    return env


def launch(data_dir: Path, ports: dict[str, int], stderr: Path) -> Dev:
    with stderr.open("w") as log:  # the child writes to its own copy of the descriptor
        process = subprocess.Popen(
            [*CLI, "dev"],
            cwd=REPO,
            env=dev_env(data_dir, ports),
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            start_new_session=True,
        )
    dev = Dev(process, ports, data_dir, stderr)
    threading.Thread(target=read_lines, args=(process, dev.output), daemon=True).start()
    return dev


def read_lines(process: subprocess.Popen[str], into: list[str]) -> None:
    """Keep reading the run's stdout, so the run never blocks on a full pipe; closed at its
    end (the last of the run's processes gone)."""
    assert process.stdout is not None
    with process.stdout:
        for line in process.stdout:
            into.append(line.rstrip("\n"))


def start(data_dir: Path, ports: dict[str, int], stderr: Path) -> Dev:
    dev = launch(data_dir, ports, stderr)
    wait_for(
        lambda: any(line.strip().startswith("curl -sN") for line in dev.output),
        START_S,
        lambda: f"no banner; exit {dev.process.poll()}\n{dev.everything()[-3000:]}",
    )
    return dev


def wait_for(condition: object, timeout: float, what: object) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, what() if callable(what) else what
        time.sleep(0.05)


def port_is_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def stack_of(dev: Dev) -> list[psutil.Process]:
    """Every process the run started: the supervisor's descendants and the PostgreSQL server
    (a daemon, with its own workers)."""
    processes = psutil.Process(dev.process.pid).children(recursive=True)
    postmaster = psutil.Process(
        int((dev.data_dir / "pg" / "postmaster.pid").read_text().split()[0])
    )
    return [*processes, postmaster, *postmaster.children(recursive=True)]


def gone(process: psutil.Process) -> bool:
    try:
        return not process.is_running() or process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def stop_with_ctrl_c(dev: Dev) -> None:
    os.killpg(dev.process.pid, signal.SIGINT)  # the terminal's Ctrl-C, to the whole group
    try:
        dev.process.wait(90)
    finally:
        if dev.process.poll() is None:
            os.killpg(dev.process.pid, signal.SIGKILL)


# Two cold starts of the whole stack, a turn and a drain, on a machine other work shares.
@pytest.mark.timeout(480)
async def test_kill_9_of_parley_dev_leaves_no_process_and_the_next_start_is_clean(
    tmp_path: Path,
) -> None:
    ports = {name: free_port() for name in ("api", "temporal", "ui", "backend", "metrics")}
    data_dir = tmp_path / "data"
    first = start(data_dir, ports, tmp_path / "first.log")
    stack = stack_of(first)
    try:
        names = {p.pid: " ".join(p.cmdline())[:80] for p in stack}
        assert any("temporal" in n for n in names.values()), names
        assert any("parley.launch.lifeline" in n for n in names.values()), names

        first.process.send_signal(signal.SIGKILL)  # `kill -9` of parley dev itself
        killed_at = time.monotonic()
        first.process.wait(10)
        wait_for(
            lambda: all(gone(p) for p in stack),
            5,
            lambda: [names[p.pid] for p in stack if not gone(p)],
        )
        print(f"\nthe stack was gone {time.monotonic() - killed_at:.1f} s after kill -9")
        assert [n for n, port in ports.items() if port_is_open(port)] == []
    finally:
        for process in stack:  # what a failed run leaves, so the next test starts clean
            if not gone(process):
                process.kill()
    noise = [line for line in first.everything().splitlines() if any(n in line for n in NOISE)]
    assert noise == [], noise

    second = start(data_dir, ports, tmp_path / "second.log")
    try:
        client = ParleyClient(second.api, second.token)
        try:
            session_id = await client.new_session()
            _, events = await client.turn(session_id, "What are your store hours in Seattle?")
            assert events[-1].type == "done", [e.type for e in events]
            kinds = [e.type for e in events]
            assert "warning" not in kinds, [e.data for e in events if e.type == "warning"]
            tools = [e.data.get("name") for e in events if e.type == "tool"]
            assert "get_store_hours" in " ".join(map(str, tools)), tools  # over MCP
        finally:
            await client.aclose()
        stop_with_ctrl_c(second)
    finally:
        if second.process.poll() is None:
            os.killpg(second.process.pid, signal.SIGKILL)
    assert second.process.returncode == 0
    wait_for(lambda: SHUTDOWN[-1] in second.output, 10, lambda: second.output[-20:])
    shutdown = [line for line in second.output if line in SHUTDOWN]
    assert shutdown == SHUTDOWN, second.output[-20:]
    noise = [line for line in second.everything().splitlines() if any(n in line for n in NOISE)]
    assert noise == [], noise
    assert [n for n, port in ports.items() if port_is_open(port)] == []


def test_a_start_that_finds_its_port_taken_names_the_process_holding_it(tmp_path: Path) -> None:
    ports = {name: free_port() for name in ("api", "temporal", "ui", "backend", "metrics")}
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", ports["api"]))
        holder.listen()
        result = subprocess.run(
            [*CLI, "dev"],
            cwd=REPO,
            env=dev_env(tmp_path / "data", ports),
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert result.returncode != 0
    said = result.stderr
    assert f"port {ports['api']} (the API) is held by pid {os.getpid()}" in said, said
    assert "PARLEY_API_PORT" in said, said
    assert not (tmp_path / "data" / "pg").exists(), "it started the database anyway"
