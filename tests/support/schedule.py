"""The order the suite's files are handed to its processes: the longest first.

`make test` hands whole files to its processes (`--dist loadfile`), each handed its next file
shortly before it ends the current one. pytest-xdist's own order (files with the most tests
first) handed out the one-test files last, several of them a minute or more long
(schemathesis, the restarts, the crashes), so one process worked on alone at the end while
the others stood idle. Longest first, the last files handed out are short ones, and the
processes end close together.

How long a file takes is read from durations.json beside this module (seconds per file, from
a run's JUnit report); a file it does not list yet is guessed from its tier. Only whole files
move: a file's tests keep their order and run together. After a change of weight, refresh the
table from a run's report (a report of one tier updates that tier's files):

    pytest -n 3 --dist loadfile --junitxml=run.xml && python -m tests.support.schedule run.xml
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

TESTS = Path(__file__).resolve().parents[1]
DURATIONS = Path(__file__).with_name("durations.json")
# A file the table does not know yet: about what a file of its tier takes.
TIER_GUESS_S = {"system": 30.0, "web": 20.0, "api": 10.0}
OTHER_GUESS_S = 3.0


class _Item(Protocol):
    nodeid: str


def test_file(nodeid: str) -> str:
    """`tests/system/test_x.py` for `tests/system/test_x.py::test_y[z]`."""
    return nodeid.split("::", 1)[0]


def expected_s(path: str, recorded: dict[str, float]) -> float:
    if path in recorded:
        return recorded[path]
    parts = path.split("/")
    tier = parts[1] if len(parts) > 2 else ""
    return TIER_GUESS_S.get(tier, OTHER_GUESS_S)


def read_durations(table: Path = DURATIONS) -> dict[str, float]:
    if not table.exists():
        return {}
    return {str(k): float(v) for k, v in json.loads(table.read_text()).items()}


def longest_first(items: list[_Item], recorded: dict[str, float] | None = None) -> None:
    """Reorder `items` in place, whole files at a time, the longest file first; files of
    equal weight keep their collected order."""
    known = read_durations() if recorded is None else recorded
    first_seen: dict[str, int] = {}
    for item in items:
        first_seen.setdefault(test_file(item.nodeid), len(first_seen))

    def key(item: _Item) -> tuple[float, int]:
        path = test_file(item.nodeid)
        return (-expected_s(path, known), first_seen[path])

    items.sort(key=key)


def durations_from_junit(report: Path) -> dict[str, float]:
    """Seconds per test file (setup, call and teardown of its tests) in a JUnit report."""
    per_file: dict[str, float] = defaultdict(float)
    for case in ET.parse(report).iter("testcase"):
        per_file[_path_of(case.get("classname", ""))] += float(case.get("time", "0"))
    return {path: round(seconds, 1) for path, seconds in sorted(per_file.items()) if path}


def _path_of(classname: str) -> str:
    """`tests/api/test_x.py` for `tests.api.test_x` or `tests.api.test_x.TestGroup`."""
    parts = classname.split(".")
    for end in range(len(parts), 0, -1):
        candidate = "/".join(parts[:end]) + ".py"
        if (TESTS.parent / candidate).exists():
            return candidate
    return ""


def main(argv: Sequence[str]) -> None:
    """Fold the reports' files into the table (a report of one tier updates that tier's
    files alone) and drop the files that are gone."""
    table = read_durations()
    for report in argv:
        table.update(durations_from_junit(Path(report)))
    table = {path: s for path, s in table.items() if (TESTS.parent / path).exists()}
    DURATIONS.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
    print(f"{len(table)} files, {sum(table.values()):.0f} s in all -> {DURATIONS}")


if __name__ == "__main__":
    main(sys.argv[1:])
