"""What `make run` starts, tended: each child process (and the embedded PostgreSQL server,
a daemon watched by its pid) that dies is started again, after a pause that grows while it
keeps dying young; one that keeps dying is given up, with its reason, and the run stops.
Stopping goes last started first (launch/dev.py says in which order that is).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import IO, TYPE_CHECKING

import psutil

from parley.launch.lifeline import Lifeline, die_with_parent

if TYPE_CHECKING:
    from parley.store.embedded import EmbeddedPostgres


# A child that dies is started again after a pause that doubles with each quick death, so a
# crash loop (a bad setting, the database gone) does not spin, and a one-off death (an OOM
# kill, an SRE's `kill -9`) is repaired at once.
FIRST_RESTART_DELAY_S = 0.5
MAX_RESTART_DELAY_S = 15.0
# A child that ran this long before dying counts as healthy: its next restart is immediate.
HEALTHY_RUN_S = 30.0
# A child that died this many times in a row, each soon after its start, is not started
# again: the run stops and says why (its last exit and the end of its log). The pauses before
# that add up to about 45 s, longer than a dependency of its takes to come back.
GIVE_UP_AFTER = 8
# How long the children other than workers get to stop after SIGTERM before they are killed.
STOP_TIMEOUT_S = 15.0


@dataclass
class Child:
    """One supervised process; `restart` says whether its death is repaired or fatal."""

    name: str
    command: list[str]
    env: dict[str, str]
    restart: bool
    stop_timeout_s: float = STOP_TIMEOUT_S
    # Where its stdout and stderr go: the supervisor's own (None) or a log file.
    output: Path | None = None
    process: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    quick_deaths: int = 0
    restart_at: float | None = None
    # How the watchman kills it if the supervisor dies (launch/lifeline.py).
    watched_as: str = "group"

    def start(self) -> None:
        # Its own process group: Ctrl-C in the terminal reaches only the supervisor, which
        # stops the children in order (API, then workers draining, then the services). A
        # supervisor killed outright takes it along (launch/lifeline.py).
        log: IO[bytes] | None = self.output.open("ab") if self.output else None
        try:
            self.process = subprocess.Popen(
                self.command,
                env=self.env,
                process_group=0,
                stdout=log,
                stderr=log,
                preexec_fn=partial(die_with_parent, os.getpid()),
            )
        finally:
            if log is not None:
                log.close()
        self.started_at = time.monotonic()
        self.restart_at = None

    @property
    def started(self) -> bool:
        return self.process is not None

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def exit_reason(self) -> str:
        assert self.process is not None and self.process.returncode is not None
        return _describe_exit(self.process.returncode)

    def exited_cleanly(self) -> bool:
        return self.process is not None and self.process.returncode == 0

    def ask_to_stop(self) -> None:
        if self.running:
            assert self.process is not None
            self.process.send_signal(signal.SIGTERM)

    def wait_stopped(self) -> bool:
        """Wait up to its stop timeout; kill it if it is still running then. Whether it
        stopped by itself."""
        assert self.process is not None
        try:
            self.process.wait(self.stop_timeout_s)
            return True
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            return False

    def kill(self) -> None:
        if self.running:
            assert self.process is not None
            self.process.kill()


class EmbeddedDatabase(Child):
    """The embedded PostgreSQL server as a supervised child. `pg_ctl` starts it as a daemon,
    nobody's child, so it is watched by its pid; started again on the same data folder it
    comes back with its data on the same socket, so the URL the children hold stays right.
    A start right after a `kill -9` may fail while the old server's backends are still
    leaving; that counts as a quick death, and the next attempt follows the usual pause."""

    def __init__(self, server: EmbeddedPostgres) -> None:
        # The server's own log (the wheel's `pg_ctl -l`): its end says why it would not start.
        super().__init__("PostgreSQL", [], {}, restart=True, output=server.pgdata / "log")
        self.watched_as = "postgres"
        self.server = server
        self.url: str | None = None
        self._postmaster: psutil.Process | None = None
        self._failure: str | None = None

    def start(self) -> None:
        self.started_at = time.monotonic()
        self.restart_at = None
        self._postmaster, self._failure = None, None
        # Forget the dead server first (the wheel caches one per data folder). Its stop may
        # still see the killed process for a moment, try `pg_ctl stop`, and fail: no matter.
        with contextlib.suppress(Exception):
            self.server.stop()
        try:
            url = self.server.start()
        except Exception as exc:  # pg_ctl failed or timed out: its log says why
            self._failure = f"could not start: {type(exc).__name__}"
            return
        if self.url is not None and url != self.url:
            self.server.stop()
            self._failure = f"came back at another address ({url})"
            return
        self.url = url
        with contextlib.suppress(psutil.Error, TypeError):
            self._postmaster = psutil.Process(self.server.pid)

    @property
    def started(self) -> bool:
        return self.started_at > 0

    @property
    def pid(self) -> int | None:
        return None if self._postmaster is None else self._postmaster.pid

    @property
    def running(self) -> bool:
        try:
            return (
                self._postmaster is not None
                and self._postmaster.is_running()
                and self._postmaster.status() != psutil.STATUS_ZOMBIE
            )
        except psutil.Error:
            return False

    def exit_reason(self) -> str:
        return self._failure or "gone"

    def exited_cleanly(self) -> bool:
        return False

    def ask_to_stop(self) -> None:
        pass  # `pg_ctl stop` (in wait_stopped) asks and waits

    def wait_stopped(self) -> bool:
        self.server.stop()  # stops it unless another process of ours still uses it
        return True

    def kill(self) -> None:
        pass  # a second Ctrl-C: the fast shutdown that follows is quick already


def _describe_exit(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-code).name}"
    return f"exit code {code}"


def _label(child: Child) -> str:
    return child.name if child.pid is None else f"{child.name} (pid {child.pid})"


class Supervisor:
    def __init__(
        self,
        log: Callable[[str], None] | None = None,
        *,
        say: Callable[[str], None] | None = None,
        lifeline: Lifeline | None = None,
        give_up_after: int = GIVE_UP_AFTER,
    ) -> None:
        self.children: list[Child] = []
        self.give_up_after = give_up_after
        self._log = log or (lambda line: print(line, file=sys.stderr, flush=True))
        # What the user is told as the run stops (stdout, beside the banner).
        self._say = say or (lambda line: print(line, flush=True))
        self.lifeline = lifeline
        # Why the child that stopped the run died (`tend` returned its name).
        self.reasons: dict[str, str] = {}

    def spawn(
        self,
        name: str,
        command: list[str],
        env: dict[str, str],
        *,
        restart: bool = False,
        stop_timeout_s: float = STOP_TIMEOUT_S,
        output: Path | None = None,
    ) -> Child:
        return self.adopt(Child(name, command, env, restart, stop_timeout_s, output))

    def adopt(self, child: Child) -> Child:
        """Start `child` and tend it from now on."""
        self._start(child)
        self.children.append(child)
        return child

    def _start(self, child: Child) -> None:
        child.start()
        if self.lifeline is not None and child.pid is not None:
            self.lifeline.watch(child.pid, how=child.watched_as)

    def tend(self) -> str | None:
        """Restart the children that died and may be restarted; return the name of one that
        died and may not, or that keeps dying (the caller stops everything; `reasons` says
        why), or None."""
        now = time.monotonic()
        for child in self.children:
            if not child.started or child.running:
                continue
            if child.restart_at is None:
                if not child.restart:
                    self.reasons[child.name] = child.exit_reason()
                    return child.name
                if not self._schedule_restart(child, now):
                    return child.name
            elif now >= child.restart_at:
                self._start(child)
                if child.pid is not None:  # else the next look says why it did not start
                    self._log(f"parley dev: {child.name} restarted (pid {child.pid})")
        return None

    def _schedule_restart(self, child: Child, now: float) -> bool:
        """Set when the dead child starts again; False when it has died too often in a row."""
        # A clean exit (a drained worker) or a long healthy run is replaced at once.
        healthy = child.exited_cleanly() or now - child.started_at >= HEALTHY_RUN_S
        child.quick_deaths = 0 if healthy else child.quick_deaths + 1
        if child.quick_deaths >= self.give_up_after:
            self.reasons[child.name] = (
                f"{child.exit_reason()}; died {child.quick_deaths} times in a row, each "
                f"within {HEALTHY_RUN_S:g}s of its start; not restarting it"
            )
            self._log(f"parley dev: {_label(child)} {self.reasons[child.name]}")
            return False
        delay = (
            0.0
            if child.quick_deaths == 0
            else min(FIRST_RESTART_DELAY_S * 2 ** (child.quick_deaths - 1), MAX_RESTART_DELAY_S)
        )
        child.restart_at = now + delay
        self._log(f"parley dev: {_label(child)} {child.exit_reason()}; restarting in {delay:.1f}s")
        return True

    def stop_all(self) -> None:
        """SIGTERM the children, last started first; children of one kind (the workers) stop
        together, each waited for up to its own timeout, then killed."""
        remaining = list(reversed(self.children))
        while remaining:
            kind = remaining[0].name.split("-")[0]
            batch = [c for c in remaining if c.name.split("-")[0] == kind]
            remaining = [c for c in remaining if c not in batch]
            for child in batch:
                child.ask_to_stop()
            for child in batch:
                if not child.started:
                    continue
                pid = child.pid
                if child.wait_stopped():
                    self._say(f"  {child.name} stopped")
                else:
                    self._say(f"  {child.name} killed (did not stop in {child.stop_timeout_s:g}s)")
                if self.lifeline is not None and pid is not None:
                    self.lifeline.release(pid)

    def kill_all(self) -> None:
        """A second Ctrl-C: no more waiting."""
        for child in self.children:
            child.kill()
