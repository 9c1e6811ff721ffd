"""Worker processes for the crash tests, forked from one that has imported worker.py already.

A test that kills a worker needs the worker in a process of its own, and `python worker.py`
spends about 2.5 s of CPU in its imports before it polls: the suite's thirty-odd spawned
workers spent more in imports than in work. Here each test process keeps a zygote: a
process that imports worker.py once, then forks one child per worker asked for. A child is
a process of its own as `python worker.py` is (its own pid, killed by SIGKILL like any), and
runs the same `worker.main()` in the environment the test gave it, with its stdin and
stdout on /dev/null and its stderr the test's.

What makes a fork safe is checked, not assumed: the zygote holds one thread when it forks
(importing worker.py starts none: no event loop, no Temporal runtime, no pool); should that
change, `serve` refuses to fork and the test fails saying so. The zygote reaps its children
and reports each exit as `subprocess` does (`-9` for SIGKILL), and when the test process
closes its end (at exit) it kills the children still running, then leaves.

`Forked` is what a test holds: `pid`, `poll()`, `wait(timeout)`, `kill()`, `terminate()`,
`send_signal()` and `returncode`, as on a `subprocess.Popen`.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import json
import os
import queue
import select
import signal
import subprocess
import sys
import threading
import traceback
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


class Forked:
    """One forked worker, as the test sees it."""

    def __init__(self, zygote: Zygote, pid: int) -> None:
        self._zygote = zygote
        self.pid = pid

    @property
    def returncode(self) -> int | None:
        return self._zygote.exit_code(self.pid)

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        code = self._zygote.wait_exit(self.pid, timeout)
        if code is None:
            raise subprocess.TimeoutExpired(f"worker {self.pid}", timeout or 0)
        return code

    def send_signal(self, sig: int) -> None:
        # As Popen's: a child already gone (reaped, its exit not read yet) is no error.
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)


class Zygote:
    """The test process's side: asks for forks, learns of exits (a reader thread)."""

    def __init__(self) -> None:
        self._process = subprocess.Popen(
            [sys.executable, "-c", "from tests.support.zygote import serve; serve()"],
            cwd=REPO,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        self._answers: queue.Queue[dict[str, Any]] = queue.Queue()
        self._exits: dict[int, int] = {}
        self._ended: str | None = None  # why the zygote is gone, once it is
        self._changed = threading.Condition()
        self._asking = threading.Lock()
        self._requests = itertools.count()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self._process.stdout is not None
        for line in self._process.stdout:
            message = json.loads(line)
            if "exit" in message:
                with self._changed:
                    self._exits[message["exit"]] = message["code"]
                    self._changed.notify_all()
            else:
                self._answers.put(message)
        ended = f"the zygote ended (exit code {self._process.wait()})"
        with self._changed:
            self._ended = ended
            self._changed.notify_all()
        self._answers.put({"error": ended})

    def fork(self, env: dict[str, str], timeout: float = 120) -> Forked:
        """A worker running with `env` as its whole environment."""
        assert self._process.stdin is not None
        with self._asking:
            request = next(self._requests)
            self._process.stdin.write(json.dumps({"id": request, "env": env}).encode() + b"\n")
            self._process.stdin.flush()
            while True:  # an answer to an earlier request that timed out is not this one's
                # The first answer waits for the zygote's own imports.
                answer = self._answers.get(timeout=timeout)
                if answer.get("id", request) == request:
                    break
        if "error" in answer:
            raise RuntimeError(f"no worker forked: {answer['error']}")
        return Forked(self, answer["pid"])

    def exit_code(self, pid: int) -> int | None:
        with self._changed:
            self._check(pid)
            return self._exits.get(pid)

    def wait_exit(self, pid: int, timeout: float | None) -> int | None:
        with self._changed:
            self._changed.wait_for(lambda: pid in self._exits or self._ended, timeout)
            self._check(pid)
            return self._exits.get(pid)

    def _check(self, pid: int) -> None:
        if pid not in self._exits and self._ended:
            raise RuntimeError(f"worker {pid}: {self._ended}; its end is unknown")

    def close(self) -> None:
        """The zygote kills the workers still running and leaves."""
        if self._process.stdin is not None and not self._process.stdin.closed:
            self._process.stdin.close()
        try:
            self._process.wait(30)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()


_zygote: Zygote | None = None
_starting = threading.Lock()


def warm_zygote() -> Zygote:
    """This test process's zygote, started (without waiting for its imports) if need be."""
    global _zygote
    with _starting:
        if _zygote is None:
            _zygote = Zygote()
            atexit.register(_zygote.close)
        return _zygote


def fork_worker(env: dict[str, str]) -> Forked:
    """`python worker.py` in `env`, forked from this test process's zygote."""
    return warm_zygote().fork(env)


# --- the zygote process ----------------------------------------------------------------------


def serve() -> None:
    """The zygote's loop: a JSON line `{"id": I, "env": {...}}` on stdin forks a worker and
    answers `{"id": I, "pid": N}`; each child's end is reported as `{"exit": N, "code": C}`.
    At the end of its input (or on its own failure) it kills its children still running and
    leaves."""
    try:
        from parley import worker  # noqa: F401  (what every child would import)
    except BaseException:
        _say({"error": traceback.format_exc()})
        raise
    woken_r, woken_w = os.pipe()
    os.set_blocking(woken_w, False)
    signal.set_wakeup_fd(woken_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a child's end wakes the select below
    children: set[int] = set()
    try:
        _serve_requests(children, (woken_r, woken_w))
    finally:  # the end of the input, or the zygote's own failure: no worker outlives it
        for pid in children:
            os.kill(pid, signal.SIGKILL)
        while children:
            _reap(children, block=True)


def _serve_requests(children: set[int], wakeup: tuple[int, int]) -> None:
    pending = b""
    while True:
        readable, _, _ = select.select([0, wakeup[0]], [], [])
        if wakeup[0] in readable:
            os.read(wakeup[0], 4096)
        _reap(children)
        if 0 not in readable:
            continue
        chunk = os.read(0, 65536)
        if not chunk:
            return
        pending += chunk
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            request = json.loads(line)
            pid = _fork(request["env"], wakeup, request["id"])
            if pid is not None:
                children.add(pid)
                _say({"id": request["id"], "pid": pid})


def _fork(env: dict[str, str], wakeup: tuple[int, int], request: int) -> int | None:
    threads = len(os.listdir("/proc/self/task"))
    if threads != 1:
        refused = f"the zygote holds {threads} threads: a fork would lose all but one"
        _say({"id": request, "error": refused})
        return None
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        code = _run_worker(env, wakeup)
    except SystemExit as stop:  # as the interpreter ends on one: a message is printed
        if isinstance(stop.code, str):
            print(stop.code, file=sys.stderr)
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stderr.flush()
        os._exit(code)


def _run_worker(env: dict[str, str], wakeup: tuple[int, int]) -> int:
    """In the child: undo what was the zygote's, then run as `python worker.py` would."""
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for fd in wakeup:
        os.close(fd)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.close(null)
    os.environ.clear()
    os.environ.update(env)  # through putenv: libpq and the rest see it too
    sys.argv = ["worker.py"]
    from parley import worker
    from parley.config import get_settings

    get_settings.cache_clear()
    worker.main()
    return 0


def _reap(children: set[int], *, block: bool = False) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, 0 if block else os.WNOHANG)
        except ChildProcessError:
            children.clear()
            return
        if pid == 0:
            return
        children.discard(pid)
        _say({"exit": pid, "code": os.waitstatus_to_exitcode(status)})
        if block:
            return


def _say(message: dict[str, Any]) -> None:
    """A line to the test process; none once it is gone (its children are killed then)."""
    with contextlib.suppress(BrokenPipeError):
        sys.stdout.write(json.dumps(message) + "\n")
        sys.stdout.flush()
