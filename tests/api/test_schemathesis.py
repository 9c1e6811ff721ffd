"""The OpenAPI document is the contract: schemathesis runs every check against the real API.

Three runs, as three callers: Priya's token for the session routes, an admin's for
`/v1/admin`, and a throwaway customer's for the erasure routes (`DELETE /v1/me` erases its
caller: never a user other tests share). Generation is deterministic (fixed seed, no example
database, one worker), so a failure here is repeatable. Posted messages go to generated
session ids, which mostly do not exist (404), so the worker sees only the few turns the
stateful phase starts.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from tests.support.erasure import add_user, new_customers

SCHEMATHESIS = Path(sys.executable).with_name("schemathesis")
ADMIN_ROUTES = "^/v1/admin/"
# `DELETE /v1/me` and the erasure's status link: run apart, as a user made for the run.
ERASURE_ROUTES = "^/v1/(me$|erasures/)"
# A reused `client_message_id` with another text is answered 422 `idempotency_key_reused`
# (api.md): a schema-valid body, rejected because of what an earlier case posted. Posting is
# the one operation where 422 is an expected answer to schema-valid data; every other
# operation keeps the default checks.
CONFIG = r"""
[[operations]]
include-path = "/v1/sessions/{session_id}/messages"
include-method = "POST"
checks.positive_data_acceptance.expected-statuses = [
    "2xx", "401", "403", "404", "409", "422", "429",
]

[[operations]]
include-path-regex = '^/v1/.*\{(tenant_id|turn_id|action_id|file_id|key)\}'
generation.max-examples = 10
"""
# Cases per operation in the fuzzing phase (the stateful phase scales with it; the coverage
# phase's boundary cases come on top). For the routes of Priya's sessions, messages and
# exports, 50 reach her own resources with varied ids, bodies and headers: over 1,000
# cases in all, which the check at the end holds.
#
# The second block above gives 10 to the /v1 routes whose path names a tenant (the admin
# routes), a turn, an action, a file or a memory key. The fuzzer cannot name one (a
# generated id is never a real one), so each of their fuzzed cases is the same 404 in the
# same error shape: at 50 each they were about 650 such cases and over a third of this
# test's time, showing nothing the first few do not. Their coverage-phase cases (every
# boundary body and parameter) are not counted by this setting and all still run.
MAX_EXAMPLES = 50


async def _run(api_url: str, token: str, report: Path, *filters: str) -> dict[str, Any]:
    """One schemathesis run; returns its JSON report. It runs in the test's own directory,
    where it keeps its cache of earlier crashes, so every run starts from the same state."""
    config = report.with_suffix(".toml")
    config.write_text(CONFIG)
    process = await asyncio.create_subprocess_exec(
        str(SCHEMATHESIS),
        "--config-file",
        str(config),
        "run",
        f"{api_url}/openapi.json",
        "--checks",
        "all",
        "--header",
        f"Authorization: Bearer {token}",
        "--max-examples",
        str(MAX_EXAMPLES),
        "--workers",
        "1",
        "--seed",
        "1",
        "--generation-deterministic",  # implies no example database
        "--request-timeout",
        "20",
        "--no-color",
        "--report",
        "json",
        "--report-json-path",
        str(report),
        *filters,
        cwd=report.parent,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    # Awaited, not blocking: the API under test serves from this same event loop.
    output, _ = await process.communicate()
    text = output.decode(errors="replace")
    assert process.returncode == 0, f"schemathesis found problems:\n{text[-6000:]}"
    return json.loads(report.read_text())


# About 10% more for the export routes, and a third pass for the erasure routes (issue 28).
@pytest.mark.timeout(240)
async def test_the_api_keeps_its_openapi_contract(
    api_url: str,
    tokens: dict[str, str],
    tmp_path: Path,
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    user = await _run(
        api_url,
        tokens["priya"],
        tmp_path / "user.json",
        "--exclude-path-regex",
        f"{ADMIN_ROUTES}|{ERASURE_ROUTES}",
    )
    [throwaway] = new_customers(1)
    erasing = await _run(
        api_url,
        await add_user(sessions, throwaway),
        tmp_path / "erasure.json",
        "--include-path-regex",
        ERASURE_ROUTES,
    )
    admin = await _run(
        api_url, tokens["admin"], tmp_path / "admin.json", "--include-path-regex", ADMIN_ROUTES
    )
    # The run may have given Priya's consent to durable memory: other tests share her.
    async with httpx.AsyncClient(base_url=api_url) as http:
        reset = await http.put(
            "/v1/memory/consent",
            json={"consent": False},
            headers={"Authorization": f"Bearer {tokens['priya']}"},
        )
        assert reset.status_code == 200, reset.text
    for report in (user, admin, erasing):
        assert report["failures"] == [] and report["errors"] == [], report
        assert report["test_cases"]["with_failures"] == 0
    generated = user["test_cases"]["generated"]
    assert generated >= 1000, f"only {generated} cases generated for the session routes"
    # The three runs between them test every operation the document lists.
    tested = sum(report["operations"]["tested"] for report in (user, admin, erasing))
    assert tested == user["operations"]["total"], [r["operations"] for r in (user, admin, erasing)]
