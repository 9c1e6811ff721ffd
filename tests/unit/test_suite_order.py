"""The suite's files go to its processes longest first (tests/support/schedule.py)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tests.support.schedule import durations_from_junit, longest_first


@dataclass
class Item:
    nodeid: str


def test_whole_files_go_longest_first_and_keep_their_tests_order() -> None:
    items = [
        Item("tests/api/test_a.py::test_one"),
        Item("tests/api/test_a.py::test_two"),
        Item("tests/unit/test_b.py::test_one"),
        Item("tests/system/test_c.py::test_one[x]"),
        Item("tests/system/test_c.py::test_one[y]"),
        Item("tests/api/test_d.py::test_one"),
    ]
    recorded = {"tests/api/test_a.py": 5.0, "tests/api/test_d.py": 90.0}
    longest_first(items, recorded)
    assert [item.nodeid for item in items] == [
        "tests/api/test_d.py::test_one",  # recorded, 90 s
        "tests/system/test_c.py::test_one[x]",  # not recorded: a system file's guess, 30 s
        "tests/system/test_c.py::test_one[y]",
        "tests/api/test_a.py::test_one",  # recorded, 5 s
        "tests/api/test_a.py::test_two",
        "tests/unit/test_b.py::test_one",  # not recorded: the smallest guess
    ]


def test_equal_files_keep_the_collected_order() -> None:
    items = [Item("tests/unit/test_z.py::t"), Item("tests/unit/test_a.py::t")]
    longest_first(items, {})
    assert [item.nodeid for item in items] == ["tests/unit/test_z.py::t", "tests/unit/test_a.py::t"]


def test_a_junit_report_gives_seconds_per_file(tmp_path: Path) -> None:
    report = tmp_path / "run.xml"
    report.write_text(
        """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest">
<testcase classname="tests.system.test_outage" name="test_a" time="40.25"/>
<testcase classname="tests.system.test_outage" name="test_b" time="2.0"/>
<testcase classname="tests.unit.test_ids" name="test_c" time="0.5"/>
<testcase classname="tests.unit.test_suite_order.TestGroup" name="test_d" time="1.0"/>
</testsuite></testsuites>"""
    )
    assert durations_from_junit(report) == {
        "tests/system/test_outage.py": 42.2,
        "tests/unit/test_ids.py": 0.5,
        "tests/unit/test_suite_order.py": 1.0,
    }
