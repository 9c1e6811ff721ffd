"""`parley eval` as an operator types it (issue 29): the command, in its own process, finds
the API and mints its users' and operator's tokens in the database, as it does against
`make run`; it prints the table, writes the JSON and HTML, and exits 0 when all pass. With
`--url`, `--token` and `--user-token` it needs no database at all."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from urllib.parse import urlsplit

from parley.config import Settings
from tests.support.evals import STARTER
from tests.support.stack import run_cli, service_env

CONVERSATIONS = ("03-order-status.yaml", "06-email-confirm.yaml")


async def parley(env: dict[str, str], *args: str) -> tuple[int, str, str]:
    done = await run_cli(None, *args, env=env, timeout=120)
    return done.returncode, done.stdout.decode(), done.stderr.decode()


def suite(tmp_path: Path) -> Path:
    folder = tmp_path / "suite"
    folder.mkdir()
    for name in CONVERSATIONS:
        shutil.copy(STARTER / name, folder / name)
    return folder


async def test_eval_mints_its_tokens_and_writes_its_reports(
    settings: Settings, api_url: str, tmp_path: Path
) -> None:
    port = str(urlsplit(api_url).port)
    env = service_env(settings, PARLEY_API_PORT=port)
    code, out, err = await parley(
        env,
        "eval",
        str(suite(tmp_path)),
        "--json",
        str(tmp_path / "r.json"),
        "--html",
        str(tmp_path / "r.html"),
    )
    assert code == 0, out + err
    result = json.loads((tmp_path / "r.json").read_text())
    assert result["suite"]["passed"] == 2 and result["exit_code"] == 0
    assert "2/2 passed" in out and "email proposal confirmed" in out
    assert "[##############################] 2/2" in err  # the progress bar
    assert "<svg" in (tmp_path / "r.html").read_text()


async def test_eval_against_a_url_with_given_tokens(
    api_url: str, northwind_url: str, tokens: dict[str, str], tmp_path: Path
) -> None:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PARLEY_DATA_DIR": str(tmp_path)}
    code, out, err = await parley(
        env,
        "eval",
        str(suite(tmp_path)),
        "--url",
        api_url,
        "--token",
        tokens["admin"],
        "--user-token",
        f"northwind/cust_2291={tokens['priya']}",
        "--backend",
        northwind_url,
        "--json",
        "-",
        "--quiet",
    )
    assert code == 0, out + err
    result = json.loads(out)
    assert [c["passed"] for c in result["conversations"]] == [True, True]
    assert all(c["tokens_in"] for c in result["conversations"])
    assert all(float(c["cost_usd"]) > 0 for c in result["conversations"])
    assert "2/2 passed" in err  # the table goes to stderr when the JSON takes stdout
