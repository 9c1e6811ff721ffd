"""Where the CPU went during a phase: per-process CPU seconds from /proc (Linux only).

Processes are grouped by role: the bench client (this process), the Parley API and worker and
the baseline server (by pid), our PostgreSQL (its postmaster and the postmaster's children)
and our Temporal dev server (the bench's other child), kernel threads (I/O flushing, loopback
networking; partly caused by the bench) and `other`: processes the bench did not start, i.e.
whatever else runs on the machine. Without /proc everything is empty.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass(frozen=True)
class Proc:
    name: str
    ppid: int
    cpu_s: float


def _process_times() -> dict[int, Proc]:
    out: dict[int, Proc] = {}
    proc = Path("/proc")
    if not proc.is_dir():
        return out
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            raw = (entry / "stat").read_text()
        except OSError:
            continue
        name = raw[raw.index("(") + 1 : raw.rindex(")")]
        # After "(comm) ": state, ppid, ... utime and stime are the 12th and 13th fields.
        fields = raw[raw.rindex(")") + 2 :].split()
        out[int(entry.name)] = Proc(
            name, int(fields[1]), (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
        )
    return out


def _machine_busy() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine since boot."""
    try:
        first = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    except OSError:
        return 0.0, 0.0
    values = [int(v) for v in first[:8]]
    idle = values[3] + values[4]  # idle + iowait
    total = sum(values)
    return (total - idle) / CLOCK_TICKS, total / CLOCK_TICKS


@dataclass
class Snapshot:
    processes: dict[int, Proc]
    busy: float
    total: float


def snapshot() -> Snapshot:
    busy, total = _machine_busy()
    return Snapshot(_process_times(), busy, total)


@dataclass(frozen=True)
class Roles:
    by_pid: dict[int, str]  # this exact process
    by_parent: dict[int, str]  # children of this process (unless named by pid)


def _role(pid: int, proc: Proc, roles: Roles) -> str:
    if pid in roles.by_pid:
        return roles.by_pid[pid]
    if proc.ppid in roles.by_parent:
        return roles.by_parent[proc.ppid]
    if pid == 2 or proc.ppid == 2:
        return "kernel"
    return "other"


def usage(before: Snapshot, after: Snapshot, roles: Roles) -> dict[str, Any]:
    """CPU seconds per role between two snapshots, the busiest `other` processes by name,
    and the machine-wide busy fraction. Processes that exited in between are not counted."""
    seconds: dict[str, float] = {}
    others: dict[str, float] = {}
    for pid, proc in after.processes.items():
        prior = before.processes.get(pid)
        spent = proc.cpu_s - prior.cpu_s if prior is not None and prior.name == proc.name else 0
        if prior is None:
            spent = proc.cpu_s
        if spent <= 0:
            continue
        role = _role(pid, proc, roles)
        seconds[role] = seconds.get(role, 0.0) + spent
        if role == "other":
            others[proc.name] = others.get(proc.name, 0.0) + spent
    result: dict[str, Any] = {
        f"{role}_cpu_s": round(value, 2) for role, value in sorted(seconds.items())
    }
    top = sorted(others.items(), key=lambda item: -item[1])[:5]
    result["other_top"] = {name: round(value, 2) for name, value in top}
    elapsed = after.total - before.total
    if elapsed > 0:
        result["machine_busy_fraction"] = round((after.busy - before.busy) / elapsed, 3)
    return result
