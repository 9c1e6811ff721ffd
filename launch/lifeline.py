"""No process of `parley dev` outlives it, and a port it needs that is taken names its holder.

Ctrl-C stops the children in order (launch/dev.py). A supervisor that is killed outright
(`kill -9`, an OOM kill, a closed terminal's SIGKILL) runs no code, so two things do it:

- Each child asks the kernel for SIGKILL when its parent dies (Linux `PR_SET_PDEATHSIG`, set
  between fork and exec by `die_with_parent`). A child whose parent died before that call
  exits at once.
- A watchman process (`python -m parley.launch.lifeline`, started first) holds the read end of a
  pipe whose write end only the supervisor has. The supervisor tells it every child it
  starts (`watch`) and the embedded PostgreSQL server, which `pg_ctl` starts as a daemon, so
  it is nobody's child. When the pipe closes (the supervisor is gone, however it went), the
  watchman kills each child's process group still running and asks PostgreSQL for an
  immediate shutdown (SIGQUIT, then SIGKILL). A process that is neither a group leader of
  ours nor PostgreSQL (the Temporal dev server the SDK starts for the bench, bench/stack.py)
  is killed with its descendants. After a clean stop nothing it knows of still runs and it
  just exits. Processes are matched by pid and start time, never by name, so a reused pid
  is left alone.

`port_holders` reads the kernel's socket tables (through psutil) for the process listening
on a port, so a start that finds a port taken says by whom.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
from typing import IO

import psutil

from parley.config import Settings

PR_SET_PDEATHSIG = 1
# How long PostgreSQL gets for its immediate shutdown before it is killed.
POSTGRES_QUIT_S = 3.0

_libc = ctypes.CDLL(None, use_errno=True) if sys.platform == "linux" else None


def die_with_parent(parent_pid: int) -> None:
    """In a child between fork and exec: SIGKILL when the parent dies (Linux only)."""
    if _libc is None:
        return
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid:  # it died before the request took effect
        os._exit(1)


class Lifeline:
    """The supervisor's end of the watchman's pipe."""

    def __init__(self) -> None:
        self._process = subprocess.Popen(
            [sys.executable, "-m", "parley.launch.lifeline"],
            stdin=subprocess.PIPE,
            text=True,
            process_group=0,  # Ctrl-C in the terminal is the supervisor's, not its
        )
        assert self._process.stdin is not None
        self._pipe: IO[str] = self._process.stdin

    @property
    def pid(self) -> int:
        return self._process.pid

    def watch(self, pid: int, *, how: str = "group") -> None:
        """Kill `pid` if the supervisor dies: its process `group` (a child started in a group
        of its own), `postgres` (an immediate shutdown of that server), or the `process` and
        its descendants (one started by a library, in the supervisor's own group)."""
        with contextlib.suppress(OSError):
            self._pipe.write(f"{how} {pid}\n")
            self._pipe.flush()

    def release(self, pid: int) -> None:
        """Leave `pid` alone after all (a server stopped, or kept on purpose for another user
        of it)."""
        self.watch(pid, how="release")

    def close(self) -> None:
        """A clean stop: everything is stopped already; the watchman exits."""
        with contextlib.suppress(OSError):
            self._pipe.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._process.wait(5)


def _watch(lines: IO[str]) -> None:
    watched: list[tuple[str, psutil.Process]] = []
    for line in lines:  # until the supervisor's end closes
        how, _, pid = line.strip().partition(" ")
        with contextlib.suppress(psutil.Error, ValueError):
            if how == "release":
                watched = [(h, p) for h, p in watched if p.pid != int(pid)]
            else:
                watched.append((how, psutil.Process(int(pid))))
    servers = [p for how, p in watched if how == "postgres" and p.is_running()]
    for server in servers:
        with contextlib.suppress(psutil.Error):
            server.send_signal(signal.SIGQUIT)
    for leader in (p for how, p in watched if how == "group"):
        for member in group_members(leader.pid, leader.create_time()):
            with contextlib.suppress(psutil.Error):
                member.kill()
    for process in (p for how, p in watched if how == "process"):
        for each in _with_descendants(process):
            with contextlib.suppress(psutil.Error):
                each.kill()
    _, alive = psutil.wait_procs(servers, timeout=POSTGRES_QUIT_S)
    for server in alive:
        with contextlib.suppress(psutil.Error):
            server.kill()


def group_members(leader_pid: int, born: float) -> list[psutil.Process]:
    """The processes of the group that the process (`leader_pid`, started at `born`) led; it
    may be gone already. The kernel gives no new process a pid still in use as a group's id,
    so while any member of that group lives the pid is not reused. A process that holds the
    pid now and started later is someone else: a leader restarted long ago, its pid taken by
    another run's server that leads a group of its own. That group is not ours."""
    try:
        if psutil.Process(leader_pid).create_time() != born:
            return []
    except psutil.NoSuchProcess:
        pass  # gone: what is left of its group is still ours
    except psutil.Error:
        return []  # another user's process holds the pid now
    members = []
    for process in psutil.process_iter():
        with contextlib.suppress(psutil.Error, OSError):
            if os.getpgid(process.pid) == leader_pid and process.create_time() >= born:
                members.append(process)
    return members


def _with_descendants(process: psutil.Process) -> list[psutil.Process]:
    """The process (if it still runs) and every process under it."""
    try:
        return [process, *process.children(recursive=True)] if process.is_running() else []
    except psutil.Error:
        return []


def port_holders(port: int) -> list[str]:
    """Who listens on TCP `port` (any address): `pid N (command line)` each, or one line
    saying a process this user may not see does; empty when the port is free."""
    holders: list[str] = []
    for conn in psutil.net_connections(kind="tcp"):
        if conn.status != psutil.CONN_LISTEN or not conn.laddr or conn.laddr.port != port:
            continue
        if conn.pid is None:
            holders.append("a process of another user")
            continue
        try:
            command = " ".join(psutil.Process(conn.pid).cmdline()) or "?"
        except psutil.Error:
            command = "?"
        holders.append(f"pid {conn.pid} ({command[:120]})")
    return sorted(set(holders))


def dev_ports(settings: Settings, workers: int) -> dict[str, tuple[int, str]]:
    """The ports `parley dev` will listen on: what → (port, the variable that moves it)."""
    ports = {"the API": (settings.api_port, "PARLEY_API_PORT")}
    if "TEMPORAL_ADDRESS" not in os.environ:
        ports["Temporal"] = (settings.dev_temporal_port, "PARLEY_DEV_TEMPORAL_PORT")
        ports["the Temporal UI"] = (settings.temporal_ui_port, "PARLEY_TEMPORAL_UI_PORT")
    if "PARLEY_NORTHWIND_URL" not in os.environ:
        ports["the demo backend"] = (settings.northwind_port, "PARLEY_NORTHWIND_PORT")
    for number in range(workers if settings.worker_metrics_port else 0):
        port = settings.worker_metrics_port + number
        ports[f"worker-{number + 1}'s metrics"] = (port, "PARLEY_WORKER_METRICS_PORT")
    return ports


def refuse_taken_ports(ports: dict[str, tuple[int, str]]) -> None:
    """Stop before anything starts when a port the run needs is taken: each such port with
    its holder and the variable that moves it (`ports`: what → (port, variable))."""
    taken = [
        f"  port {port} ({what}) is held by {', '.join(holders)}; stop it or set {variable}"
        for what, (port, variable) in ports.items()
        if (holders := port_holders(port))
    ]
    if taken:
        raise SystemExit("parley dev cannot start, ports are taken:\n" + "\n".join(taken))


if __name__ == "__main__":
    # Its own session's signals are not the supervisor's concern: only the pipe ends it.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _watch(sys.stdin)
