"""`parley eval --compare` (issue 29, acceptance 2) against the session's shared stack on the
demo model: a configuration withholding `get_order` fails the conversations that need it,
naming the expectation, and exits non-zero; an identical configuration shows no differences;
the tenant's own configuration is back afterwards. The whole starter suite and its report
are tests/web/test_eval_report.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import httpx
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from parley.tenancy import TenantConfig
from parley_eval.command import EXIT_REGRESSION, Options, evaluate
from tests.support.evals import STARTER, eval_target


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
