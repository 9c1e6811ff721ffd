"""The `make run` supervisor's rules and the dev state file, with tiny stand-in processes.

The full `parley dev` is exercised in test_make_run.py; these pin down the rules it relies on
(backoff, which deaths are fatal, stopping, one metrics port per worker, which settings the
CLI takes from a running supervisor) in a second or two.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from parley.config import Settings
from parley.launch.dev import _spawn_workers
from parley.launch.devstate import state_path, with_dev_services, write_dev_state
from parley.launch.supervisor import Child, Supervisor

DIES = [sys.executable, "-c", "raise SystemExit(3)"]
SLEEPS = [sys.executable, "-c", "import time; time.sleep(60)"]


def _tend_until(supervisor: Supervisor, lines: list[str], count: int) -> None:
    deadline = time.monotonic() + 20
    while len(lines) < count:
        assert supervisor.tend() is None
        assert time.monotonic() < deadline, lines
        time.sleep(0.02)


def test_a_child_that_keeps_dying_is_restarted_with_a_growing_pause() -> None:
    lines: list[str] = []
    supervisor = Supervisor(log=lines.append)
    supervisor.spawn("worker-1", DIES, dict(os.environ), restart=True)
    try:
        _tend_until(supervisor, lines, 4)
    finally:
        supervisor.stop_all()
    assert "exit code 3; restarting in 0.5s" in lines[0]
    assert lines[1].startswith("parley dev: worker-1 restarted (pid ")
    assert "exit code 3; restarting in 1.0s" in lines[2]


def test_a_child_that_keeps_dying_young_is_given_up_with_its_reason() -> None:
    # A crash loop (a dependency that cannot start on its data) is reported, not looped
    # forever: after `give_up_after` quick deaths in a row, `tend` names it, and says why.
    lines: list[str] = []
    supervisor = Supervisor(log=lines.append, give_up_after=3)
    supervisor.spawn("temporal", DIES, dict(os.environ), restart=True)
    deadline = time.monotonic() + 20
    try:
        while (dead := supervisor.tend()) is None:
            assert time.monotonic() < deadline, lines
            time.sleep(0.02)
    finally:
        supervisor.stop_all()
    assert dead == "temporal"
    assert supervisor.reasons["temporal"].startswith("exit code 3; died 3 times in a row")
    assert [line.split(") ", 1)[-1] for line in lines if "restarting in" in line] == [
        "exit code 3; restarting in 0.5s",
        "exit code 3; restarting in 1.0s",
    ]
    assert "not restarting it" in lines[-1]


def test_a_clean_exit_is_replaced_at_once_and_a_fatal_child_stops_everything() -> None:
    lines: list[str] = []
    supervisor = Supervisor(log=lines.append)
    supervisor.spawn("worker-1", [sys.executable, "-c", "pass"], dict(os.environ), restart=True)
    _tend_until(supervisor, lines, 1)
    assert "exit code 0; restarting in 0.0s" in lines[0]
    supervisor.spawn("temporal", DIES, dict(os.environ))
    deadline = time.monotonic() + 20
    while (dead := supervisor.tend()) is None:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    supervisor.stop_all()
    assert dead == "temporal"


def test_stop_all_terminates_every_child_last_started_first() -> None:
    supervisor = Supervisor(log=lambda _: None)
    children = [
        supervisor.spawn(name, SLEEPS, dict(os.environ), restart=True)
        for name in ("temporal", "worker-1", "worker-2", "api")
    ]
    supervisor.stop_all()
    assert all(not child.running for child in children)
    assert all(child.process is not None and child.process.returncode < 0 for child in children)


def test_each_worker_gets_its_own_metrics_port() -> None:
    spawned: list[tuple[str, dict[str, str]]] = []

    class Recorder(Supervisor):
        def spawn(self, name: str, command: list[str], env: dict[str, str], **_: Any) -> Child:
            spawned.append((name, env))
            return Child(name, command, env, True)

    ports = _spawn_workers(Settings(worker_metrics_port=9500), Recorder(), {}, 3)
    assert ports == [9500, 9501, 9502]
    assert [(n, e["PARLEY_WORKER_METRICS_PORT"]) for n, e in spawned] == [
        ("worker-1", "9500"),
        ("worker-2", "9501"),
        ("worker-3", "9502"),
    ]


def test_the_cli_takes_what_the_environment_leaves_unset_from_a_running_dev(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for variable in ("DATABASE_URL", "PARLEY_DATABASE_URL", "TEMPORAL_ADDRESS"):
        monkeypatch.delenv(variable, raising=False)
    dev = Settings(
        data_dir=tmp_path,
        database_url=f"postgresql://postgres@/parley?host={tmp_path / 'pg'}",
        temporal_address="127.0.0.1:7999",
    )
    write_dev_state(dev, embedded_database=True)
    found = with_dev_services(Settings(data_dir=tmp_path))
    assert found.database_url == dev.database_url
    assert found.temporal_address == "127.0.0.1:7999"
    # Set in the environment (here: passed explicitly), the operator's value wins.
    mine = with_dev_services(Settings(data_dir=tmp_path, database_url="postgresql://db/x"))
    assert mine.database_url == "postgresql://db/x"


def test_an_external_database_url_is_never_written_and_a_dead_supervisor_is_ignored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DATABASE_URL", raising=False)
    dev = Settings(data_dir=tmp_path, database_url="postgresql://parley:secret@db/parley")
    write_dev_state(dev, embedded_database=False)
    assert "secret" not in state_path(dev).read_text()

    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        text=True,
        capture_output=True,
        check=True,
    )
    state = json.loads(state_path(dev).read_text())
    state.update(pid=int(gone.stdout), database_url="postgresql://postgres@/parley?host=/x")
    state_path(dev).write_text(json.dumps(state))
    assert with_dev_services(Settings(data_dir=tmp_path)).database_url is None
