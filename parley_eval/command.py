"""`parley eval SUITE`: load, (apply a tenant configuration,) run, score, report, and the
exit status: 0 when every conversation passes (or nothing regressed against `--baseline`),
1 on a regression (a conversation failing that passed in the baseline, or in run A of a
`--compare`, or any failure when there is no baseline), 2 on a write invariant violation,
3 when the suite is malformed (nothing ran).
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from parley.eval import html, report
from parley.eval.client import AdminClient
from parley.eval.runner import Progress, Target, run_suite
from parley.eval.score import score
from parley.eval.suite import SuiteError, load_suite

EXIT_REGRESSION = 1
EXIT_INVARIANT = 2
EXIT_MALFORMED = 3


@dataclass
class Options:
    suite: Path
    tenant_config: Path | None = None
    compare: tuple[Path, Path] | None = None
    json_out: Path | None = None
    html_out: Path | None = None
    baseline: Path | None = None
    trace_url: str | None = None
    quiet: bool = False
    # The tenant that --tenant-config and --compare configure.
    config_tenant: str = "northwind"


@dataclass
class Outcome:
    runs: list[dict[str, Any]]
    differences: list[dict[str, Any]] | None
    # With --compare: each conversation's cost in A and B, and B's difference.
    costs: list[dict[str, Any]] | None
    regressions: list[str]
    exit_code: int


def read_config(path: Path) -> dict[str, Any]:
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise SuiteError(f"{path}: not a JSON tenant configuration ({exc})") from None
    if not isinstance(config, dict):
        raise SuiteError(f"{path}: a tenant configuration is a JSON object")
    return config


def read_baseline(path: Path) -> dict[str, Any]:
    """A result saved with `--json`: its conversations and whether each passed."""
    try:
        saved = json.loads(path.read_text())
        _ = [(c["name"], c["passed"]) for c in saved["conversations"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SuiteError(f"{path}: not a result saved with --json ({exc!r})") from None
    return dict(saved)


async def evaluate(options: Options, target: Target, progress: Progress | None = None) -> Outcome:
    """The whole command, minus printing: raises `SuiteError` before anything runs."""
    suite = load_suite(options.suite)
    configs: list[tuple[str, dict[str, Any] | None]]
    if options.compare is not None:
        configs = [(str(p), read_config(p)) for p in options.compare]
    elif options.tenant_config is not None:
        configs = [(str(options.tenant_config), read_config(options.tenant_config))]
    else:
        configs = [("current configuration", None)]
    baseline = read_baseline(options.baseline) if options.baseline else None
    runs = []
    for label, config in configs:
        async with _configured(target, options.config_tenant, config):
            seen = await run_suite(suite, target, progress)
        by_path = {item.path: item.conversation for item in suite}
        runs.append(report.result([score(by_path[s.path], s) for s in seen], label=label))
    diffs = report.differences(runs[0], runs[1]) if len(runs) == 2 else None
    costs = report.cost_differences(runs[0], runs[1]) if len(runs) == 2 else None
    reference = baseline if baseline is not None else (runs[0] if len(runs) == 2 else None)
    latest = runs[-1]
    if reference is not None:
        found = report.regressions(latest, reference)
    else:
        found = [f"{c['name']}: fails" for c in latest["conversations"] if not c["passed"]]
    violations = sum(run["suite"]["invariant_violations"] for run in runs)
    code = EXIT_INVARIANT if violations else (EXIT_REGRESSION if found else 0)
    return Outcome(runs, diffs, costs, found, code)


@asynccontextmanager
async def _configured(
    target: Target, tenant: str, config: dict[str, Any] | None
) -> AsyncIterator[None]:
    """`tenant` under `config` for the run, and its own configuration again after."""
    if config is None:
        yield
        return
    token = await target.admin_token_for(tenant)
    if token is None:
        raise SuiteError(f"a tenant configuration needs an operator token for {tenant}")
    admin = AdminClient(target.url, token)
    try:
        previous = await admin.config(tenant)
        await admin.put_config(tenant, config)
        try:
            yield
        finally:
            await admin.put_config(tenant, previous)
    finally:
        await admin.aclose()


def write_outputs(options: Options, outcome: Outcome) -> None:
    latest = outcome.runs[-1]
    document: dict[str, Any] = {
        **latest,
        "runs": outcome.runs if len(outcome.runs) > 1 else None,
        "differences": outcome.differences,
        "cost_differences": outcome.costs,
        "regressions": outcome.regressions,
        "exit_code": outcome.exit_code,
    }
    if options.json_out is not None:
        text = json.dumps(document, indent=2) + "\n"
        if str(options.json_out) == "-":
            sys.stdout.write(text)
        else:
            options.json_out.write_text(text)
    if options.html_out is not None:
        options.html_out.write_text(
            html.render(latest, trace_url=options.trace_url, diffs=outcome.differences)
        )


def terminal(outcome: Outcome) -> str:
    parts = []
    for run in outcome.runs:
        parts += [f"== {run['label']}", report.table(run)]
    if outcome.differences is not None:
        parts.append("== differences (A -> B)")
        parts += [
            f"{d['name']}: {d['a']} -> {d['b']}"
            + "".join(f"\n    only in B: {p}" for p in d.get("only_in_b", []))
            + "".join(f"\n    only in A: {p}" for p in d.get("only_in_a", []))
            for d in outcome.differences
        ] or ["no differences"]
    if outcome.costs is not None:
        parts.append("== cost in USD (A -> B, difference)")
        parts += [f"{c['name']}: {c['a']} -> {c['b']} ({c['difference']})" for c in outcome.costs]
    parts += [f"regression: {line}" for line in outcome.regressions]
    return "\n".join(parts)


def progress_bar(stream: Any = sys.stderr) -> Progress:
    def show(done: int, total: int, name: str) -> None:
        width = 30
        filled = width * done // max(total, 1)
        bar = "#" * filled + "-" * (width - filled)
        end = "\n" if done == total else ""
        stream.write(f"\r[{bar}] {done}/{total} {name[:40]:<40}{end}")
        stream.flush()

    return show


def main(options: Options, target: Target) -> int:
    """Run, print the table (stderr when the JSON goes to stdout), write the files."""
    progress = None if options.quiet else progress_bar()
    try:
        outcome = asyncio.run(evaluate(options, target, progress))
    except SuiteError as exc:
        sys.stderr.write(f"{exc}\nnothing was run\n")
        return EXIT_MALFORMED
    out = sys.stderr if str(options.json_out) == "-" else sys.stdout
    out.write(terminal(outcome) + "\n")
    write_outputs(options, outcome)
    return outcome.exit_code
