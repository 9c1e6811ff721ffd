"""The bench's own logic, without its stack: the section guard (a failed section costs only
its own figures, and latest.json is still written), the open-loop schedule, the acceptance
block read from a run's figures. (The shape of the new-shape skeleton on the dev server is
read in tests/api/test_bench_skeleton.py.)"""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path
from typing import Any, cast

from bench.__main__ import live_only, memory_sections, parse_args, shown_path
from bench.acceptance import render_acceptance
from bench.memory import render_memory
from bench.open_loop import (
    Load,
    _arrive,
    arrival_times,
    floor_capacities,
    plain_capacity,
    render_floors,
    render_open_loop,
)
from bench.recall_latency import render_recall_latency
from bench.runner import Turn
from bench.sections import Section, needed, render_sections, run_sections, write_document
from bench.stack import Stack
from bench.timeline import STAGES, render_timeline


async def _figures() -> dict[str, Any]:
    return {"turns_per_s": 12.5}


async def _broken() -> dict[str, Any]:
    raise RuntimeError("gave up waiting for a summary workflow")


async def test_a_section_that_raises_leaves_the_others_figures_and_the_json(
    tmp_path: Path,
) -> None:
    sections = [
        Section("before", _figures, lambda f: f"before: {f['turns_per_s']}"),
        Section("memory", _broken, lambda f: f"memory: {f['tokens']}"),
        Section("after", _figures, lambda f: f"after: {f['turns_per_s']}"),
    ]
    results: dict[str, Any] = {}
    await run_sections(sections, results)
    output = tmp_path / "bench" / "latest.json"
    write_document(output, {"quick": True}, results)

    written = json.loads(output.read_text())["results"]
    assert written["before"] == written["after"] == {"turns_per_s": 12.5}
    assert written["memory"] == {"error": "RuntimeError: gave up waiting for a summary workflow"}
    shown = render_sections(sections, results)
    assert "before: 12.5" in shown and "after: 12.5" in shown
    assert "memory: FAILED: RuntimeError: gave up waiting" in shown


async def test_a_section_built_on_a_failed_one_says_which() -> None:
    results: dict[str, Any] = {}

    async def builds_on_memory() -> Any:
        return needed(results, "memory")

    await run_sections([Section("memory", _broken), Section("next", builds_on_memory)], results)
    assert results["next"] == {"error": "RuntimeError: needs the figures of 'memory', which failed"}


def test_a_table_that_cannot_be_drawn_does_not_hide_the_others() -> None:
    sections = [
        Section("odd", _figures, lambda f: f["missing"]),
        Section("fine", _figures, lambda f: "fine table"),
    ]
    shown = render_sections(sections, {"odd": {"x": 1}, "fine": {"x": 1}})
    assert "odd: figures measured, table failed" in shown
    assert "fine table" in shown


def test_a_failed_part_of_the_memory_section_costs_only_its_own_table() -> None:
    tokens = {
        "turns": 20,
        "model_calls": 37,
        "input_tokens": 50203,
        "naive_input_tokens": 98282,
        "ratio": 0.511,
        "largest_prompt": 1823,
        "cached_tokens": 34782,
        "summaries": 7,
        "summarizer_input_tokens": 5100,
        "summarizer_output_tokens": 522,
        "summarizer_tokens": 5622,
    }
    memory = {
        "tokens": [tokens],
        "done": {"error": "RPCError: workflow not found"},
        "locomo_share": 0.11,
        "locomo": [],
        "locomo_skipped": True,
    }
    shown = render_memory(memory)
    assert "50203" in shown and "(d) FAILED: RPCError: workflow not found" in shown
    assert "5100" in shown and "522" in shown  # the summarizer's input and output, apart
    assert "0 sections that failed: memory.done" in render_acceptance({"memory": memory})


def test_open_loop_arrivals_are_a_fixed_poisson_schedule() -> None:
    times = arrival_times(5.0, 60.0, random.Random(25))
    assert times == arrival_times(5.0, 60.0, random.Random(25))
    assert times == sorted(times) and 0 < times[0] and times[-1] < 60.0
    assert 240 < len(times) < 360  # 300 expected; the Poisson spread, with room


def test_an_open_loop_session_runs_as_many_turns_as_a_session_of_a_then_a_fresh_one() -> None:
    made: list[str] = []
    ran: list[str] = []

    async def new_keys(n: int) -> list[str]:
        fresh = [f"s{len(made) + k}" for k in range(n)]
        made.extend(fresh)
        return fresh

    async def run(key: str, i: int) -> Turn:
        ran.append(key)
        return Turn(ok=True, first_delta_s=0.01, total_s=0.02)

    async def drive() -> None:
        keys: asyncio.Queue[str] = asyncio.Queue()
        for key in await new_keys(2):
            keys.put_nowait(key)
        await _arrive(Load(new_keys, run, turns_per_key=3), keys, [0.0] * 12)

    asyncio.run(drive())
    assert len(ran) == 12
    assert max(ran.count(k) for k in set(ran)) == 3  # no session past its third turn
    assert len(set(ran)) >= 4  # fresh sessions took the old ones' places


def test_capacity_is_the_best_plain_rate_of_any_table() -> None:
    tables = {
        "20": {"rows": {"parley plain": {"turns_per_s": 10.3}}},
        "50": {"rows": {"parley plain": {"turns_per_s": 11.1}}},
    }
    assert plain_capacity(tables) == (11.1, "50 concurrent sessions")


def test_the_floors_are_loaded_from_the_table_parleys_capacity_came_from() -> None:
    tables = {
        "20": {
            "rows": {
                "parley plain": {"turns_per_s": 10.3},
                "baseline": {"turns_per_s": 90.0},
                "skeleton new shape": {"turns_per_s": 50.0},
            }
        },
        "50": {
            "rows": {
                "parley plain": {"turns_per_s": 11.1},
                "baseline": {"turns_per_s": 70.0},
                "skeleton new shape": {"turns_per_s": 40.0},
            }
        },
    }
    capacity = plain_capacity(tables)
    assert floor_capacities(tables, capacity) == {"baseline": 70.0, "skeleton new shape": 40.0}


def _floor(p95_ms: float, unloaded_ms: float) -> dict[str, Any]:
    return {
        "rate_per_s": 20.0,
        "duration_s": 30.0,
        "turns": {"first_delta": {"p50_ms": unloaded_ms, "p95_ms": p95_ms}},
        "unloaded_p50_ms": unloaded_ms,
        "p95_over_unloaded_p50": p95_ms / unloaded_ms,
        "client_start_lag_max_ms": 1.0,
    }


def test_the_open_loop_shows_the_floors_ratios_beside_parleys() -> None:
    report = {"p50_ms": 90.0, "p95_ms": 250.0}
    results = {
        "open_loop": {
            "capacity_turns_per_s": 12.0,
            "capacity_from": "20 concurrent sessions",
            "rate_per_s": 6.0,
            "duration_s": 60.0,
            "arrivals": 360,
            "turns": {"first_delta": report, "full_turn": report, "ok": 360, "events_lost": 0},
            "unloaded_first_delta_p50_ms": 70.0,
            "first_delta_p50_over_unloaded_p50": 90 / 70,
            "first_delta_p95_over_unloaded_p50": 250 / 70,
            "client_start_lag_max_ms": 3.0,
            "sessions_added": 0,
        },
        "open_loop_floors": {
            "baseline": _floor(30.0, 10.0),
            "skeleton new shape": _floor(45.0, 15.0),
        },
    }
    block = render_acceptance(results)
    # Point 4 reads Parley's ratio against the new-shape skeleton's at half its own capacity.
    assert "first delta p95 250.0 ms = 3.57x the unloaded p50 70.0 ms" in block
    assert "skeleton new shape's p95 at half its capacity 3.00x its unloaded p50" in block
    assert "3.57 / 3.00 = 1.19 (target <= 1.3): met" in block
    assert "3.57x" in render_open_loop(results["open_loop"])
    floors = render_floors(results["open_loop_floors"])
    assert "skeleton new shape" in floors and "3.00x" in floors


def _row(turns_per_s: float, cpu_total: float, lost: int = 0) -> dict[str, Any]:
    return {
        "turns_per_s": turns_per_s,
        "cpu_ms_per_turn_total": cpu_total,
        "cpu_ms_per_turn": {"api": 20.0, "worker": 71.0, "temporal": 42.0, "postgres": 22.0},
        "events_lost": lost,
    }


def _step(n: int, *, lost: int = 0, dup: int = 0) -> dict[str, Any]:
    return {"n": n, "lost": lost, "duplicated": dup}


def test_the_acceptance_block_reads_each_figure_against_its_target() -> None:
    results = {
        "sequential": {
            "parley": {"first_delta": {"p50_ms": 80.6, "p95_ms": 100.0}},
            "baseline": {"first_delta": {"p50_ms": 9.8, "p95_ms": 20.0}},
            "ratio_parley_over_baseline": {"first_delta_p50": 8.22, "first_delta_p95": 3.4},
        },
        "concurrent": {
            "20": {
                "rows": {
                    "parley plain": _row(10.3, 155.0),
                    "parley tool": _row(6.5, 300.0),
                    "skeleton regular x1": _row(54.8, 30.0),
                    "skeleton new shape": _row(80.0, 20.0),
                },
                "ratios": {
                    "plain": {
                        "turns_per_s_over_one_activity_skeleton": 0.19,
                        "turns_per_s_over_new_shape_skeleton": 0.13,
                        "cpu_over_one_activity_skeleton": 5.17,
                    },
                    "tool": {"turns_per_s_over_one_activity_skeleton": 0.12},
                },
            }
        },
        "stream_scale": {
            "baseline_commit": "6fe9d89",
            "baseline": {"ceiling": 20, "steps": [_step(10), _step(20), _step(40, lost=3)]},
            "current": {"ceiling": 80, "steps": [_step(10), _step(80, dup=1), _step(160, lost=2)]},
        },
        "memory": {"error": "RuntimeError: boom"},
    }
    block = render_acceptance(results)
    assert "0 sections that failed: memory" in block
    assert "= 8.22x (target <= 3x): NOT met" in block
    assert "= 3.40x (target <= 3.5x): met" in block
    assert "19% of the one-activity skeleton's 54.80 (target >= 65%): NOT met" in block
    assert "13% of the new-shape skeleton's 80.00" in block
    assert "12% of the one-activity skeleton's (target >= 40%): NOT met" in block
    assert "lost events in the Parley rows of that table: 0 (target 0): met" in block
    assert "= 5.17x the one-activity skeleton's 30 ms (target <= 1.7x): NOT met" in block
    assert "4 not measured: open_loop, open_loop_floors failed or skipped" in block
    assert "ceiling 80 / the starting commit's (6fe9d89) 20 = 4.00x (target >= 4x): met" in block
    # Below the ceiling only: the step past it lost events, one under it repeated one.
    assert "lost or duplicated events at the 2 steps up to it: 1 (target 0): NOT met" in block


def test_import_speed_alone_runs_only_its_section() -> None:
    """(p) alone, without (o)'s ten conversations (which need their data and take long)."""
    args = parse_args(["--import-speed-only"])
    assert live_only(args)
    assert [s.name for s in memory_sections(args, cast(Stack, None))] == ["import_speed"]
    both = parse_args(["--locomo-import-only", "--locomo-dir", "."])
    assert [s.name for s in memory_sections(both, cast(Stack, None))] == [
        "import_speed",
        "locomo_import",
    ]


def test_recall_latency_alone_runs_no_other_section_and_prints_the_ratios() -> None:
    args = parse_args(["--recall-latency-only", "--recall-latency-turns", "4"])
    assert live_only(args)  # no latency, load or offline sections
    assert memory_sections(args, cast(Stack, None)) == []

    def timing(p50: float) -> dict[str, Any]:
        return {
            "turns": 4,
            "ok": 4,
            "first_delta": {"p50_ms": p50, "p95_ms": p50 * 1.5},
            "full_turn": {"p50_ms": p50 * 4},
        }

    shown = render_recall_latency(
        {
            "baseline": timing(100.0),
            "on": timing(230.0),
            "off": timing(200.0),
            "messages": 600,
            "embeddings": "local-minilm",
            "first_delta_p50_ratio": {
                "on_over_baseline": 2.3,
                "off_over_baseline": 2.0,
                "on_over_off": 1.15,
            },
            "recall": {"on": {"hybrid": 2, "fts": 5}, "off": {"fts": 7}},
        }
    )
    assert "600 imported messages" in shown
    assert "on 2.30x, off 2.00x; on over off 1.15x" in shown
    assert "on: the builds recalled by fts 5, hybrid 2" in shown


def test_the_stage_table_sets_parleys_way_to_its_first_step_beside_temporals_floor() -> None:
    stages = dict(zip(STAGES, (25.0, 0.5, 24.5, 0.0, 0.4, 11.0, 5.0), strict=True))
    timeline = {
        "turns": 20,
        "stages_p50_ms": stages,
        "skeleton_first_step_p50_ms": 40.5,
        "eager_local_first_step_p50_ms": 15.4,
        "build_p50_ms": 22.0,
        "builds_early": 20,
    }
    table = render_timeline(timeline)
    assert "floor: start -> no-op first activity      40.5" in table
    assert "floor: eager start -> first local step    15.4" in table
    sequential = {
        "parley": {"first_delta": {"p50_ms": 72.5, "p95_ms": 90.8}},
        "baseline": {"first_delta": {"p50_ms": 16.5, "p95_ms": 27.8}},
        "ratio_parley_over_baseline": {"first_delta_p50": 4.4, "first_delta_p95": 3.27},
    }
    block = render_acceptance({"sequential": sequential, "timeline": timeline})
    assert "POST -> first step running 50.0 ms; Temporal's floor for a turn's shape" in block
    assert "(eager start -> first local step) 15.4 ms" in block
    # A run that made no start eager has no such floor, and says nothing of it.
    del timeline["eager_local_first_step_p50_ms"]
    assert "eager" not in render_timeline(timeline)
    block = render_acceptance({"sequential": sequential, "timeline": timeline})
    assert "where it goes" in block and "Temporal's floor" not in block


def test_the_report_names_its_figures_file_relative_to_the_repository(tmp_path: Path) -> None:
    # The report is pasted into docs/benchmarks-results.md: no machine's folders in it.
    assert shown_path(parse_args([]).output) == ".data/bench/latest.json"
    elsewhere = tmp_path / "figures.json"
    assert shown_path(elsewhere) == str(elsewhere)
