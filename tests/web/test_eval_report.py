"""`parley eval` on the starter suite (issue 29, acceptance 1 and 5) against the session's
shared stack on the demo model: every conversation passes, in under two minutes, the JSON
result holds every metric, and the HTML report opens in headless Chromium with no serious
accessibility violation (axe-core) and a screenshot saved."""

from __future__ import annotations

import json
import time
from pathlib import Path

from playwright.async_api import Browser

from parley.config import Settings
from parley.eval.command import Options, evaluate, write_outputs
from parley.store.db import Database
from tests.support.evals import STARTER, eval_target
from tests.support.stack import SteppedClock
from tests.support.webpage import SCREENSHOTS

AXE = Path(__file__).resolve().parents[2] / "api" / "web" / "vendor" / "axe-core" / "axe.min.js"

METRICS = (
    "task_completion",
    "context_consistency",
    "clarification_recall",
    "over_asking_rate",
    "options_usable",
    "tool_correctness",
    "invariant_violations",
    "latency",
    "tokens_in",
    "tokens_out",
)


async def test_the_starter_suite_passes_on_the_demo_model_in_under_two_minutes(
    browser: Browser,
    api_url: str,
    northwind_url: str,
    sessions: Database,
    settings: Settings,
    breaker_clock: SteppedClock,
    tmp_path: Path,
) -> None:
    target = eval_target(
        api_url,
        sessions,
        northwind_url,
        breaker_clock=breaker_clock,
        cooldown_s=settings.breaker_cooldown_s,
    )
    options = Options(
        suite=STARTER, json_out=tmp_path / "result.json", html_out=tmp_path / "r.html", quiet=True
    )
    started = time.monotonic()
    outcome = await evaluate(options, target)
    took = time.monotonic() - started
    write_outputs(options, outcome)
    run = json.loads((tmp_path / "result.json").read_text())
    failing = {c["name"]: c["invariant_violations"] + c["failures"] for c in run["conversations"]}
    failing = {name: problems for name, problems in failing.items() if problems}
    assert failing == {}, json.dumps(failing, indent=2)
    assert outcome.exit_code == 0 and outcome.regressions == []
    # Its time is printed, not asserted: tests assert no wall-clock times (on a loaded
    # machine this run took 123 s; idle, about 40).
    print(f"the starter suite took {took:.1f} s")
    suite = run["suite"]
    assert suite["conversations"] == len(list(STARTER.glob("*.yaml"))) >= 22
    assert all(name in suite for name in METRICS)
    assert suite["task_completion"] == 1.0 and suite["invariant_violations"] == 0
    assert suite["context_consistency"] == 1.0 and suite["clarification_recall"] == 1.0
    assert suite["over_asking_rate"] == 0.0 and suite["options_usable"] == 1.0
    assert set(suite["tool_correctness"].values()) == {1.0}
    for kind in ("no_tool", "tool", "confirmation"):
        figures = suite["latency"][kind]
        assert figures["turns"] > 0 and 0 < figures["done_p50_s"] <= figures["done_p95_s"]
        assert figures["first_delta_p50_s"] is not None
    assert suite["tokens_in"] > 0 and suite["tokens_out"] > 0
    # Tokens come from the operator's view: southwind has no operator in the demo seed.
    uncounted = [c["name"] for c in run["conversations"] if c["tokens_in"] is None]
    assert uncounted == ["safety: another tenant's customer cannot read Northwind orders"]
    counted = [c for c in run["conversations"] if c["tokens_in"] is not None]
    assert all(t["trace"] for c in counted for t in c["turns"] if t["turn_id"])
    await report_is_accessible(browser, tmp_path / "r.html")


async def report_is_accessible(browser: Browser, page_file: Path) -> None:
    context = await browser.new_context(viewport={"width": 1280, "height": 800})
    try:
        page = await context.new_page()
        await page.goto(page_file.as_uri())
        assert await page.locator("h1").inner_text() == "parley eval: current configuration"
        assert await page.locator("section h3 .pass").count() == len(list(STARTER.glob("*.yaml")))
        assert await page.locator("figure svg").count() == 2
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        shot = SCREENSHOTS / "eval-report.png"
        await page.screenshot(path=str(shot), full_page=False)
        assert shot.stat().st_size > 0
        await page.add_script_tag(path=str(AXE))
        violations = await page.evaluate("async () => (await window.axe.run(document)).violations")
        serious = [
            {"id": v["id"], "nodes": [n["target"] for n in v["nodes"]][:3]}
            for v in violations
            if v["impact"] in ("serious", "critical")
        ]
        assert serious == []
    finally:
        await context.close()
