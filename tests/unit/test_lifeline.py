"""The watchman kills only what its run started (launch/lifeline.py `group_members`).

`parley dev` restarts a child that dies, and the watchman keeps the dead one's pid: its group
may hold processes of its own. A pid is reused once nothing uses it, so by the time the run
ends another run's server may hold that pid and lead a group of its own. Killing it took down
another test's `parley dev` (its demo backend, which may not die: the whole run stopped).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import psutil
import pytest

from parley.launch.lifeline import group_members

SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]


@pytest.fixture
def leader() -> Iterator[subprocess.Popen[bytes]]:
    """A group leader with one more member in its group, as a supervised child is."""
    process = subprocess.Popen(SLEEPER, process_group=0)
    member = subprocess.Popen(SLEEPER, process_group=process.pid)
    try:
        yield process
    finally:
        for each in (process, member):
            each.kill()
            each.wait()


def test_the_group_of_a_live_leader_is_its_own(leader: subprocess.Popen[bytes]) -> None:
    born = psutil.Process(leader.pid).create_time()
    members = group_members(leader.pid, born)
    assert len(members) == 2
    assert leader.pid in {m.pid for m in members}


def test_a_pid_held_by_a_later_process_is_left_alone(leader: subprocess.Popen[bytes]) -> None:
    """The watched leader started earlier and is gone; the process holding its pid now leads
    another run's group."""
    born = psutil.Process(leader.pid).create_time()
    assert group_members(leader.pid, born - 30.0) == []


def test_the_rest_of_a_gone_leaders_group_is_still_found() -> None:
    """The leader died; a process it left in its group is still ours to kill."""
    process = subprocess.Popen(SLEEPER, process_group=0)
    member = subprocess.Popen(SLEEPER, process_group=process.pid)
    born = psutil.Process(process.pid).create_time()
    try:
        process.kill()
        process.wait()
        assert [m.pid for m in group_members(process.pid, born)] == [member.pid]
    finally:
        member.kill()
        member.wait()
