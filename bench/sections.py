"""The sections of one bench run, each in its own guard, and the run's figures on disk.

A bench run takes many minutes and measures a dozen things. One section that fails (a
timeout, a crashed process, a bug in a table) must cost only its own figures: its error goes
to stderr and into the JSON as `{"error": ...}`, the later sections still run, and
`latest.json` is written with everything that was measured.
"""

from __future__ import annotations

import datetime as dt
import json
import sys
import traceback
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.stack import log

BASELINE = "DemoModel streamed as SSE by a bare FastAPI app (bench/baseline.py)"


@dataclass(frozen=True)
class Section:
    name: str  # its key in the results (and in latest.json)
    measure: Callable[[], Awaitable[Any]]
    # Its table for stdout, from its own figures; None for a section that prints nothing.
    render: Callable[[Any], str] | None = None


def failure(name: str, exc: BaseException) -> dict[str, str]:
    """What a failed section leaves: its error on stderr (with the traceback) and in the JSON."""
    error = f"{type(exc).__name__}: {exc}"
    log(f"{name} failed: {error}")
    traceback.print_exception(exc, file=sys.stderr)
    return {"error": error}


def failed(figures: Any) -> bool:
    return isinstance(figures, dict) and set(figures) == {"error"}


def needed(results: dict[str, Any], name: str) -> Any:
    """Another section's figures, for a section that builds on them: a clear error when that
    section failed or did not run, rather than a KeyError deep inside."""
    figures = results.get(name)
    if figures is None or failed(figures):
        raise RuntimeError(
            f"needs the figures of {name!r}, which {'failed' if figures else 'did not run'}"
        )
    return figures


async def guarded(name: str, measure: Callable[[], Awaitable[Any]]) -> Any:
    """The figures `measure` returns, or its failure: for a section, or a part of one whose
    neighbours must survive it."""
    try:
        return await measure()
    except Exception as exc:
        return failure(name, exc)


async def run_sections(sections: Sequence[Section], results: dict[str, Any]) -> None:
    """Run the sections in order, each to its end or to its error; each one's figures go into
    `results` as soon as it finishes, so a later failure cannot take them."""
    for section in sections:
        results[section.name] = await guarded(section.name, section.measure)


def failures(results: dict[str, Any]) -> list[str]:
    """The sections that failed, and the parts that failed inside a section that did not."""
    found = []
    for name, figures in results.items():
        if failed(figures):
            found.append(name)
        elif isinstance(figures, dict):
            found += [f"{name}.{part}" for part, value in figures.items() if failed(value)]
    return found


def render_sections(sections: Sequence[Section], results: dict[str, Any]) -> str:
    """Every section's table, or the line saying it failed; a table that cannot be drawn
    from its figures says so instead of hiding the others."""
    parts: list[str] = []
    for section in sections:
        if section.name not in results or section.render is None:
            continue
        figures = results[section.name]
        if failed(figures):
            parts.append(f"\n{section.name}: FAILED: {figures['error']}")
            continue
        try:
            parts.append(section.render(figures))
        except Exception as exc:
            parts.append(f"\n{section.name}: figures measured, table failed: {exc!r}")
    return "\n".join(parts)


def write_document(path: Path, settings: dict[str, Any], results: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    document = {
        "measured_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "settings": settings,
        "baseline": BASELINE,
        "results": results,
    }
    path.write_text(json.dumps(document, indent=2, default=str) + "\n")
