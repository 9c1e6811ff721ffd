"""`parley eval` (issue 29) against the session's shared stack on the demo model: the starter
suite passes in under two minutes with every metric in its JSON result (acceptance 1 and 5;
the HTML report in Chromium is tests/web/test_eval_report.py); a configuration withholding
`get_order` fails the conversations that need it, naming the expectation, and exits
non-zero, while an identical configuration shows no differences (acceptance 2)."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import httpx
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from parley.config import Settings
from parley.tenancy import TenantConfig
from parley_eval.command import EXIT_REGRESSION, Options, evaluate
from tests.support.evals import STARTER, eval_target
from tests.support.stack import SteppedClock

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
    api_url: str,
    northwind_url: str,
    sessions: async_sessionmaker[AsyncSession],
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
    options = Options(suite=STARTER, json_out=tmp_path / "result.json", quiet=True)
    started = time.monotonic()
    outcome = await evaluate(options, target)
    took = time.monotonic() - started
    run = outcome.runs[0]
    (tmp_path / "result.json").write_text(json.dumps(run, indent=2))
    failing = {c["name"]: c["invariant_violations"] + c["failures"] for c in run["conversations"]}
    failing = {name: problems for name, problems in failing.items() if problems}
    assert failing == {}, json.dumps(failing, indent=2)
    assert outcome.exit_code == 0 and outcome.regressions == []
    print(f"the starter suite took {took:.1f} s")
    assert took < 120, f"the starter suite took {took:.0f} s"
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


def subset(tmp_path: Path, *names: str) -> Path:
    folder = tmp_path / "suite"
    folder.mkdir()
    for name in names:
        shutil.copy(STARTER / name, folder / name)
    return folder


async def test_withholding_get_order_fails_the_conversations_that_need_it(
    api_url: str,
    northwind_url: str,
    sessions: async_sessionmaker[AsyncSession],
    tokens: dict[str, str],
    tmp_path: Path,
) -> None:
    target = eval_target(api_url, sessions, northwind_url)
    suite = subset(
        tmp_path,
        "03-order-status.yaml",
        "08-stated-id-needs-no-question.yaml",
        "09-referent-change-by-id.yaml",
    )
    async with httpx.AsyncClient(
        base_url=api_url, headers={"Authorization": f"Bearer {tokens['admin']}"}
    ) as admin:
        config_url = "/v1/admin/tenants/northwind/config"
        before = (await admin.get(config_url)).json()["config"]
        a = tmp_path / "a.json"
        a.write_text(json.dumps(before))
        b = tmp_path / "b.json"
        allowed = sorted(TenantConfig.known_tools() - {"get_order"})
        b.write_text(json.dumps({**before, "tool_allowlist": allowed}))

        options = Options(suite=suite, compare=(a, b), quiet=True)
        outcome = await evaluate(options, target)
        assert outcome.exit_code == EXIT_REGRESSION
        assert outcome.differences is not None
        changed = {d["name"]: d for d in outcome.differences}
        assert set(changed) == {
            "a stated order id needs no clarification",
            "referent changes when the user names another order",
        }
        for difference in changed.values():
            assert (difference["a"], difference["b"]) == ("pass", "fail")
            assert any(
                "tools.called get_order(order_id=8390): not called" in problem
                for problem in difference["only_in_b"]
            ), difference
        assert sorted(line.split(":")[0] for line in outcome.regressions) == sorted(changed)
        assert (await admin.get(config_url)).json()["config"] == before  # restored

        same = await evaluate(Options(suite=suite, compare=(a, a), quiet=True), target)
        assert same.differences == [] and same.exit_code == 0
        assert (await admin.get(config_url)).json()["config"] == before
