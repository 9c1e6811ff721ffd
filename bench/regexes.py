"""(i) Regular expressions against long hostile input: does any pattern grow faster than the
text it scans?

Every pattern compiled at module level in the code that reads user, model or tool text
(screens, the log redactor, the resolver, recall, memory, ...) is run with `finditer` over
runs of characters its parts like to match ('@', '.', spaces, letters, digits, "at ", "dot "),
at two lengths. A linear scan takes about four times as long on four times the text; a
pattern that restarts a long match at every position takes sixteen times as long, and on a
4 MB answer that is the difference between milliseconds and minutes (five such patterns, in
parley/screens.py and parley/logs.py, took 1-10 s on 20,000 characters before they were
fixed; this scan finds each of them). The baseline is a plain word pattern over the same text.

    python -m bench.regexes
"""

from __future__ import annotations

import importlib
import pkgutil
import re
import time
from dataclasses import dataclass
from typing import Any

# Packages whose patterns read text that a user, a model or a tool wrote.
PACKAGES = ("parley", "parley.api", "parley.activities", "parley.store", "parley.gateway")
# Runs that make a greedy part match far and then fail: each repeated to the scanned length.
RUNS = (" ", "a", "@", ".", "0", "-", "_", "\n", "a@", "a.", "a ", "at ", "dot ", "1 ", "a-")
SHORT, LONG = 20_000, 80_000
# Past this a pattern is not tried at the longer length (it is already the finding).
SLOW_S = 0.5
# Growth from SHORT to LONG above this reads as worse than linear (linear: about 4,
# quadratic 16).
SUSPECT_GROWTH = 8.0
# A scan of the long run below this is not a finding, whatever its growth.
NOTICEABLE_MS = 100.0
# Each figure is the best of this many scans: another process's burst only adds time.
REPEATS = 3
BASELINE = re.compile(r"\w+")


@dataclass(frozen=True)
class Finding:
    name: str  # module.attribute
    run: str  # the repeated text that took longest
    short_ms: float
    long_ms: float | None  # None: not tried, the short run was already slow

    @property
    def growth(self) -> float | None:
        if self.long_ms is None or self.short_ms <= 0:
            return None
        return self.long_ms / self.short_ms


def module_patterns() -> dict[str, re.Pattern[str]]:
    """Every compiled str pattern bound at module level (or on a module-level class)."""
    found: dict[str, re.Pattern[str]] = {}
    seen: set[str] = set()  # one entry per pattern text (a module may re-export another's)
    for package in PACKAGES:
        root = importlib.import_module(package)
        for info in pkgutil.walk_packages(root.__path__, prefix=f"{package}."):
            if info.name.endswith("__main__"):
                continue  # a program, not a library: importing it would run it
            try:
                module = importlib.import_module(info.name)
            except Exception:  # an optional dependency missing: its patterns are not scanned
                continue
            for attr, value in vars(module).items():
                for name, pattern in _patterns_in(f"{info.name}.{attr}", value):
                    if pattern.pattern not in seen:
                        seen.add(pattern.pattern)
                        found[name] = pattern
    return found


def _patterns_in(name: str, value: Any) -> list[tuple[str, re.Pattern[str]]]:
    if isinstance(value, re.Pattern) and isinstance(value.pattern, str):
        return [(name, value)]
    if isinstance(value, type) and value.__module__ == name.rsplit(".", 1)[0]:
        return [
            (f"{name}.{attr}", inner)
            for attr, inner in vars(value).items()
            if isinstance(inner, re.Pattern) and isinstance(inner.pattern, str)
        ]
    return []


def scan_ms(pattern: re.Pattern[str], text: str) -> float:
    best = float("inf")
    for _ in range(REPEATS):
        started = time.perf_counter()
        for _ in pattern.finditer(text):
            pass
        best = min(best, time.perf_counter() - started)
    return best * 1000


def worst_case(name: str, pattern: re.Pattern[str]) -> Finding:
    """The run that took longest at the short length, then the same run at the long one."""
    timed = [(scan_ms(pattern, (run * SHORT)[:SHORT]), run) for run in RUNS]
    short_ms, run = max(timed)
    if short_ms / 1000 > SLOW_S:
        return Finding(name, run, short_ms, None)
    return Finding(name, run, short_ms, scan_ms(pattern, (run * LONG)[:LONG]))


def measure_regexes() -> dict[str, Any]:
    patterns = module_patterns()
    findings = sorted(
        (worst_case(name, pattern) for name, pattern in patterns.items()),
        key=lambda f: -(f.long_ms if f.long_ms is not None else f.short_ms * 1000),
    )
    baseline = worst_case("baseline", BASELINE)
    suspect = [f.name for f in findings if _suspect(f)]
    return {
        "patterns": len(findings),
        "lengths": [SHORT, LONG],
        "baseline": _row(baseline),
        "slowest": [_row(f) for f in findings[:8]],
        "suspect": suspect,
    }


def _suspect(f: Finding) -> bool:
    """Too slow to try at the long length, or both faster-growing than linear and slow
    enough to matter (below that, the growth figure is mostly noise)."""
    if f.long_ms is None:
        return True
    return (f.growth or 0) > SUSPECT_GROWTH and f.long_ms > NOTICEABLE_MS


def _row(f: Finding) -> dict[str, Any]:
    return {
        "name": f.name,
        "run": f.run,
        "short_ms": round(f.short_ms, 2),
        "long_ms": None if f.long_ms is None else round(f.long_ms, 2),
        "growth": None if f.growth is None else round(f.growth, 2),
    }


def render_regexes(result: dict[str, Any]) -> str:
    short, long = result["lengths"]
    lines = [
        f"(i) Regular expressions over hostile runs: {result['patterns']} patterns, the slowest "
        f"(ms for {short:,} / {long:,} characters; linear growth is about 4x)",
    ]
    for row in [result["baseline"], *result["slowest"]]:
        long_ms = "not tried" if row["long_ms"] is None else f"{row['long_ms']:9.2f}"
        growth = "" if row["growth"] is None else f"{row['growth']:5.2f}x"
        lines.append(
            f"  {row['name'][:52]:52} {row['run']!r:8} {row['short_ms']:9.2f} {long_ms} {growth}"
        )
    suspect = ", ".join(result["suspect"]) or "none"
    lines.append(
        f"  worse than linear (over {SUSPECT_GROWTH:g}x and {NOTICEABLE_MS:g} ms) or too slow "
        f"to try: {suspect}"
    )
    return "\n".join(lines)


def main() -> None:
    print(render_regexes(measure_regexes()))


if __name__ == "__main__":
    main()
