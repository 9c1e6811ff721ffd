"""The pure rules of skills (parley/skills.py), the catalog and the sandbox on their own:
which month an argument names, which files a skill may hand back, when `run_skill` is
offered, and that a sandboxed skill sees neither the network nor a writable skill folder."""

from __future__ import annotations

import json
import os
import shutil
import time
from datetime import date
from pathlib import Path

import pytest

from parley.activities.sandbox import Sandbox, SkillRunError
from parley.activities.skills import load_catalog
from parley.config import REPO_ROOT
from parley.skills import (
    RUN_ENV,
    RUN_SKILL,
    SkillLimits,
    SkillManifest,
    artifact_content_type,
    effective_limits,
    month_range,
)
from parley.tenancy import TenantConfig
from parley.wire import MessageView, tool_view

TODAY = date(2026, 10, 28)


def test_a_month_name_is_the_latest_such_month_that_has_begun() -> None:
    assert month_range("October", TODAY) == (date(2026, 10, 1), date(2026, 10, 31))
    assert month_range("december", TODAY) == (date(2025, 12, 1), date(2025, 12, 31))
    assert month_range("2024-02", None) == (date(2024, 2, 1), date(2024, 2, 29))
    assert month_range("2026-13", TODAY) is None
    assert month_range("Someday", TODAY) is None


def test_a_skill_returns_only_plain_names_of_known_kinds() -> None:
    assert artifact_content_type("spending_by_week.png") == "image/png"
    assert artifact_content_type("rows.csv") == "text/csv"
    for refused in (".hidden.png", "../x.png", "a/b.png", "run.sh", "page.html"):
        assert artifact_content_type(refused) is None, refused


def test_the_wall_clock_never_exceeds_the_deployments_cap() -> None:
    limits = SkillLimits(wall_clock_s=120)
    assert effective_limits(limits, wall_clock_cap_s=5).wall_clock_s == 5
    assert effective_limits(limits, wall_clock_cap_s=150).wall_clock_s == 120


def test_run_skill_is_offered_only_to_a_tenant_that_enables_a_skill() -> None:
    assert not TenantConfig().offered(RUN_SKILL)
    assert not TenantConfig(skills=[]).offered(RUN_SKILL)
    assert TenantConfig(skills=["spending_chart"]).offered(RUN_SKILL)


def test_the_catalog_leaves_out_a_broken_skill(tmp_path: Path) -> None:
    shutil.copytree(REPO_ROOT / "skills" / "spending_chart", tmp_path / "spending_chart")
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "manifest.json").write_text('{"name": "broken"}')
    (tmp_path / "misnamed").mkdir()
    (tmp_path / "misnamed" / "main.py").write_text("")
    manifest = {"name": "other", "description": "x"}
    (tmp_path / "misnamed" / "manifest.json").write_text(json.dumps(manifest))
    assert list(load_catalog(tmp_path)) == ["spending_chart"]


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap: `make sandbox`")
async def test_a_sandboxed_skill_cannot_write_its_own_folder_or_see_the_worker(
    tmp_path: Path,
) -> None:
    skill = tmp_path / "catalog" / "peek"
    skill.mkdir(parents=True)
    (skill / "main.py").write_text(
        "import json, os, pathlib\n"
        "seen = {'env': sorted(os.environ), 'home': os.path.exists('/root'),\n"
        "        'srv': os.path.exists(" + repr(str(REPO_ROOT)) + ")}\n"
        "try:\n"
        "    pathlib.Path('/skill/x').write_text('x'); seen['wrote_skill'] = True\n"
        "except OSError:\n"
        "    seen['wrote_skill'] = False\n"
        "print(json.dumps(seen))\n"
    )
    manifest = SkillManifest(name="peek", description="peek")
    sandbox = Sandbox(bwrap="bwrap", root=tmp_path / "scratch")
    ran = await sandbox.run(
        run_id="t", skill_dir=skill, manifest=manifest, limits=manifest.limits, payload={}
    )
    seen = json.loads(ran.summary)
    assert seen["wrote_skill"] is False and not (skill / "x").exists()
    assert seen["srv"] is False and seen["home"] is False
    assert set(seen["env"]) <= {
        "PATH",
        "HOME",
        "PYTHONDONTWRITEBYTECODE",
        "PWD",
        "LC_CTYPE",
        RUN_ENV,
    }, seen
    assert list((tmp_path / "scratch").iterdir()) == []


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap: `make sandbox`")
async def test_a_skill_over_its_memory_limit_fails(tmp_path: Path) -> None:
    skill = tmp_path / "hog"
    skill.mkdir()
    (skill / "main.py").write_text("x = bytearray(400 * 1024 * 1024)\n")
    manifest = SkillManifest(
        name="hog", description="hog", limits=SkillLimits(memory_mb=128, wall_clock_s=20)
    )
    sandbox = Sandbox(bwrap="bwrap", root=tmp_path / "scratch")
    with pytest.raises(SkillRunError) as failed:
        await sandbox.run(
            run_id="t", skill_dir=skill, manifest=manifest, limits=manifest.limits, payload={}
        )
    assert failed.value.code == "skill_failed"
    assert "MemoryError" in str(failed.value)


def test_the_sweep_removes_only_scratch_folders_no_run_could_still_use(tmp_path: Path) -> None:
    old, fresh, other = (tmp_path / n for n in ("parley-sandbox-a", "parley-sandbox-b", "keep"))
    for folder in (old, fresh, other):
        (folder / "out").mkdir(parents=True)
    an_hour_ago = time.time() - 3600
    os.utime(old, (an_hour_ago, an_hour_ago))
    os.utime(other, (an_hour_ago, an_hour_ago))
    assert Sandbox(bwrap="bwrap", root=tmp_path).sweep() == ["parley-sandbox-a"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep", "parley-sandbox-b"]


def test_a_skill_runs_tool_message_names_its_files_and_nothing_of_its_result() -> None:
    chart = {"file_id": "fil_1", "name": "spending_by_week.png", "content_type": "image/png"}
    ran = {
        "skill": "spending_chart",
        "summary": '{"weeks": []}',
        "artifacts": [chart | {"bytes": 9}],
    }
    shown = tool_view(json.dumps({"name": "run_skill", "result": ran})).model_dump()
    assert shown["files"] == [chart | {"bytes": 9}]
    assert "summary" not in json.dumps(shown)
    # Any other tool (or a run that made nothing) shows no `files` key at all.
    for stored in ({"name": "get_order", "result": {"order_id": "8472"}}, {"name": "run_skill"}):
        assert "files" not in tool_view(json.dumps(stored)).model_dump()
    assert "files" in MessageView.model_json_schema()["$defs"]["ToolView"]["properties"]
