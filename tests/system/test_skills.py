"""Skills in an ephemeral sandbox, end to end through the public API: tenant `northwind` with
skills enabled, the demo model, real Postgres, Temporal and bubblewrap.

Dana's chart: an `artifact` event, the PNG downloadable by her alone (decoded here: four
weekly bars for October, the week of the 19th the tallest), and the sandbox gone afterwards
(no process, no scratch folder). A skill that tries the network and one that runs past its
(short) wall clock both end the turn `done` with a `warning` and no file. A worker with no
sandbox to be had says so with a `warning` and answers without the skill.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import zlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
from temporalio.client import Client

from parley.activities.sandbox import SCRATCH_PREFIX
from parley.config import REPO_ROOT, Settings
from parley.demo_backend.app import create_app as create_backend
from parley.gateway.demo import DemoModel
from parley.ids import workflow_id_for_turn
from parley.skills import RUN_ENV
from parley.store import tenants
from parley.store.db import Database
from parley.store.identity import create_token
from parley.workflows.turn import TurnWorkflow
from tests.support.client import ParleyClient
from tests.support.histories import HISTORIES, replayer, scrub
from tests.support.stack import serve
from tests.support.toolkit import Stack, eventually, own_stack, reply

CHART = "Make me a chart of my October spending by week."
WALL_CLOCK_S = 4.0

# A skill that tries to reach the backend (reachable from the worker, so only the sandbox
# stands in the way): connected, it would write a file that would come back as an artifact.
NET_PROBE = """
import json, socket, sys
from pathlib import Path
target = json.loads(Path(__file__).with_name("target.json").read_text())
with socket.create_connection((target["host"], target["port"]), timeout=3) as s:
    s.sendall(b"GET /clock HTTP/1.0\\r\\n\\r\\n")
    Path(sys.argv[2], "reached.txt").write_bytes(s.recv(200))
"""
# A skill that never finishes on its own (sleeping, so only the wall clock can stop it).
SLEEPER = "import time\ntime.sleep(600)\n"


def _skill(root: Path, name: str, code: str, **extra: Any) -> None:
    folder = root / name
    folder.mkdir()
    (folder / "main.py").write_text(code)
    manifest = {"name": name, "description": f"test skill {name}", "entry": "main.py"}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    for file_name, content in extra.items():
        (folder / file_name).write_text(content)


@pytest_asyncio.fixture(scope="module")
async def backend() -> AsyncIterator[tuple[str, httpx.AsyncClient]]:
    async with serve(create_backend()) as url, httpx.AsyncClient(base_url=url) as client:
        yield url, client


@pytest.fixture(scope="module")
def catalog(tmp_path_factory: pytest.TempPathFactory, backend: tuple[str, Any]) -> Path:
    """The real spending_chart beside two misbehaving skills of this module."""
    root = tmp_path_factory.mktemp("skills")
    shutil.copytree(REPO_ROOT / "skills" / "spending_chart", root / "spending_chart")
    address = httpx.URL(backend[0])
    target = json.dumps({"host": address.host, "port": address.port})
    _skill(root, "net_probe", NET_PROBE, **{"target.json": target})
    _skill(root, "sleeper", SLEEPER)
    return root


@pytest.fixture(scope="module")
def scratch_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("sandboxes")


@pytest_asyncio.fixture(scope="module")
async def enabled(sessions: Database) -> AsyncIterator[None]:
    """Tenant `northwind` with the three skills; its configuration is put back afterwards."""
    async with sessions() as db:
        before = await tenants.tenant_config(db, tenant_id="northwind")
        skills = ["spending_chart", "net_probe", "sleeper"]
        await tenants.set_config(
            db, tenant_id="northwind", config=before.model_copy(update={"skills": skills})
        )
        await db.commit()
    try:
        yield
    finally:
        async with sessions() as db:
            await tenants.set_config(db, tenant_id="northwind", config=before)
            await db.commit()


@pytest_asyncio.fixture(scope="module")
async def stack(
    settings: Settings,
    temporal_client: Client,
    sessions: Database,
    backend: tuple[str, httpx.AsyncClient],
    catalog: Path,
    scratch_root: Path,
    enabled: None,
) -> AsyncIterator[Stack[DemoModel]]:
    async with own_stack(
        temporal_client,
        settings,
        sessions,
        DemoModel(token_delay_s=0),
        prefix="skills",
        northwind_url=backend[0],
        skills_dir=catalog,
        sandbox_root=scratch_root,
        sandbox_wall_clock_s=WALL_CLOCK_S,
    ) as running:
        yield running


@pytest_asyncio.fixture
async def dana(stack: Stack[DemoModel], sessions: Database) -> AsyncIterator[ParleyClient]:
    async with sessions() as db:
        token = await create_token(db, tenant_id="northwind", user_id="cust_4410")
        await db.commit()
    client = ParleyClient(stack.url, token)
    yield client
    await client.aclose()


def skill_processes(turn_id: str) -> list[str]:
    """Command lines of the live processes of this turn's sandboxes: bubblewrap's and the
    skill's own (told by the run id the sandbox puts in their environment)."""
    found = []
    marker = f"{RUN_ENV}={turn_id}-".encode()
    for proc in Path("/proc").iterdir():
        try:
            environ = (proc / "environ").read_bytes()
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if marker in environ or f"{SCRATCH_PREFIX}{turn_id}-".encode() in cmdline:
            found.append(cmdline.replace(b"\0", b" ").decode())
    return found


async def sleeping_skill(turn_id: str) -> list[str] | None:
    return [c for c in skill_processes(turn_id) if "/skill/main.py" in c] or None


def leftovers(root: Path) -> list[str]:
    return [p.name for p in root.iterdir() if p.name.startswith(SCRATCH_PREFIX)]


def decode_png(data: bytes) -> tuple[int, int, list[bytes]]:
    """Width, height and RGB rows of an 8-bit truecolour PNG (all five row filters)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, header = 8, b"", b""
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length : pos + 12 + length])
        assert zlib.crc32(kind + body) == crc, kind
        header = body if kind == b"IHDR" else header
        idat += body if kind == b"IDAT" else b""
        pos += 12 + length
    width, height, depth, colour = struct.unpack(">IIBB", header[:10])
    assert (depth, colour) == (8, 2)
    raw, stride, rows = zlib.decompress(idat), width * 3, []
    previous = bytearray(stride)
    for y in range(height):
        kind, line = (
            raw[y * (stride + 1)],
            bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)]),
        )
        for x in range(stride):
            left = line[x - 3] if x >= 3 else 0
            up, corner = previous[x], previous[x - 3] if x >= 3 else 0
            if kind == 1:
                line[x] = (line[x] + left) & 0xFF
            elif kind == 2:
                line[x] = (line[x] + up) & 0xFF
            elif kind == 3:
                line[x] = (line[x] + (left + up) // 2) & 0xFF
            elif kind == 4:
                p = left + up - corner
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
                line[x] = (
                    line[x] + (left if pa <= pb and pa <= pc else up if pb <= pc else corner)
                ) & 0xFF
        rows.append(bytes(line))
        previous = line
    return width, height, rows


def bars(width: int, rows: list[bytes]) -> list[int]:
    """The heights of the coloured bars, left to right: runs of saturated pixels in the row
    just above the x axis, each measured upwards."""

    def coloured(y: int, x: int) -> bool:
        r, g, b = rows[y][3 * x : 3 * x + 3]
        return max(r, g, b) - min(r, g, b) > 60

    base = max(y for y in range(len(rows)) if sum(coloured(y, x) for x in range(width)) > 0)
    runs, x = [], 0
    while x < width:
        if coloured(base, x):
            start = x
            while x < width and coloured(base, x):
                x += 1
            middle = (start + x) // 2
            runs.append(sum(1 for y in range(base + 1) if coloured(y, middle)))
        x += 1
    return runs


async def replay_and_maybe_record(client: Client, turn_id: str) -> None:
    """The skill turn's history replays on the current code; `PARLEY_RECORD_HISTORY=turn_vN`
    keeps it as tests/histories/turn_vN_skill.json for tests/replay/test_replay.py."""
    handle = client.get_workflow_handle(workflow_id_for_turn(turn_id))
    await handle.result()
    history = await handle.fetch_history()
    # No patch marker (a new shape is a new build), only local steps', a skill step included.
    markers = [
        e.marker_recorded_event_attributes.marker_name
        for e in history.events
        if e.HasField("marker_recorded_event_attributes")
    ]
    assert set(markers) <= {"core_local_activity"}, markers
    await replayer(TurnWorkflow).replay_workflow(history)
    name = os.environ.get("PARLEY_RECORD_HISTORY")
    if name:
        (HISTORIES / f"{name}_skill.json").write_text(scrub(history.to_json()))


async def test_danas_chart_is_an_artifact_she_alone_can_download(
    dana: ParleyClient,
    tokens: dict[str, str],
    stack: Stack[DemoModel],
    scratch_root: Path,
    temporal_client: Client,
) -> None:
    sid = await dana.new_session()
    turn_id, events = await dana.turn(sid, CHART)
    text = reply(events)
    artifacts = [e.data for e in events if e.type == "artifact"]
    assert len(artifacts) == 1, [(e.type, e.data) for e in events]
    artifact = artifacts[0]
    assert artifact["name"].endswith(".png") and artifact["content_type"] == "image/png"
    assert "chart" in text and artifact["name"] in text, text
    assert not [e for e in events if e.type == "warning"]

    download = await dana.http.get(f"/v1/sessions/{sid}/files/{artifact['file_id']}")
    assert download.status_code == 200, download.text
    assert download.headers["content-type"] == "image/png"
    assert len(download.content) == artifact["bytes"]
    width, _, rows = decode_png(download.content)
    heights = bars(width, rows)
    # Dana's October by ISO week: 1,200.00; 1,165.00; 3,815.40 (the cancelled order left
    # out); 2,100.00.
    assert len(heights) == 4, heights
    assert heights.index(max(heights)) == 2 and heights[3] > heights[0] > heights[1], heights

    priya = ParleyClient(stack.url, tokens["priya"])
    try:
        theirs = await priya.http.get(f"/v1/sessions/{sid}/files/{artifact['file_id']}")
        assert theirs.status_code == 404
    finally:
        await priya.aclose()

    assert skill_processes(turn_id) == []
    assert leftovers(scratch_root) == []
    await replay_and_maybe_record(temporal_client, turn_id)


async def test_a_skill_that_tries_the_network_fails_cleanly(
    dana: ParleyClient, scratch_root: Path
) -> None:
    sid = await dana.new_session()
    turn_id, events = await dana.turn(sid, "Run the net_probe skill.")
    text = reply(events)
    warnings = [e.data for e in events if e.type == "warning"]
    assert [w["code"] for w in warnings] == ["skill_failed"], warnings
    assert not [e for e in events if e.type == "artifact"]
    assert "didn't finish" in text
    assert skill_processes(turn_id) == []
    assert leftovers(scratch_root) == []


async def test_a_skill_past_its_wall_clock_is_stopped_and_released(
    dana: ParleyClient, scratch_root: Path
) -> None:
    sid = await dana.new_session()
    posted = await dana.post(sid, "Run the sleeper skill.")
    assert posted.status_code == 202, posted.text
    turn_id = posted.json()["turn_id"]

    async def sleeping() -> list[str] | None:
        return skill_processes(turn_id) or None

    # While it sleeps, its sandbox is there to be seen (so the checks after it can fail).
    running = await eventually(sleeping, timeout=30, what="the sleeper's sandbox running")
    assert any("bwrap" in c for c in running), running
    await eventually(
        lambda: sleeping_skill(turn_id), timeout=30, what="the sleeper itself, in its sandbox"
    )
    assert leftovers(scratch_root)
    events = await dana.events(sid, turn_id)
    text = reply(events)
    warnings = [e.data for e in events if e.type == "warning"]
    assert [w["code"] for w in warnings] == ["skill_timed_out"], warnings
    assert not [e for e in events if e.type == "artifact"]
    assert "time limit" in text
    assert skill_processes(turn_id) == []
    assert leftovers(scratch_root) == []


@pytest_asyncio.fixture(scope="module")
async def no_sandbox(
    settings: Settings,
    temporal_client: Client,
    sessions: Database,
    backend: tuple[str, httpx.AsyncClient],
    catalog: Path,
    enabled: None,
) -> AsyncIterator[Stack[DemoModel]]:
    """A worker where no sandbox can be had (its bubblewrap is missing)."""
    async with own_stack(
        temporal_client,
        settings,
        sessions,
        DemoModel(token_delay_s=0),
        prefix="nosandbox",
        northwind_url=backend[0],
        skills_dir=catalog,
        sandbox_bwrap="/nonexistent/bwrap",
    ) as running:
        yield running


async def test_with_no_sandbox_the_turn_says_so_and_answers_without_the_skill(
    no_sandbox: Stack[DemoModel], sessions: Database
) -> None:
    async with sessions() as db:
        token = await create_token(db, tenant_id="northwind", user_id="cust_4410")
        await db.commit()
    dana = ParleyClient(no_sandbox.url, token)
    try:
        sid = await dana.new_session()
        _, events = await dana.turn(sid, CHART)
    finally:
        await dana.aclose()
    text = reply(events)
    warnings = [e.data for e in events if e.type == "warning"]
    assert [w["code"] for w in warnings] == ["sandbox_unavailable"], warnings
    assert not [e for e in events if e.type == "artifact"]
    tools = [e.data["name"] for e in events if e.type == "tool" and e.data["phase"] == "end"]
    assert tools == ["run_skill", "search_orders"], tools
    assert "can't make charts" in text and "sandbox" in text, text
    # The weekly totals in words, from the plain search (the cancelled order left out).
    for total in ("$1,200.00", "$1,165.00", "$3,815.40", "$2,100.00"):
        assert total in text, text


async def test_a_turn_stopped_while_its_skill_runs_still_releases_the_sandbox(
    dana: ParleyClient, scratch_root: Path
) -> None:
    sid = await dana.new_session()
    posted = await dana.post(sid, "Run the sleeper skill.")
    assert posted.status_code == 202, posted.text
    turn_id = posted.json()["turn_id"]
    await eventually(
        lambda: sleeping_skill(turn_id), timeout=30, what="the sleeper itself, in its sandbox"
    )
    stopped = await dana.http.post(f"/v1/sessions/{sid}/turns/{turn_id}/cancel")
    assert stopped.status_code == 202, stopped.text
    events = await dana.events(sid, turn_id)
    assert events[-1].type == "cancelled", [(e.type, e.data) for e in events[-3:]]
    assert not [e for e in events if e.type == "artifact"]

    async def released() -> bool:
        return not skill_processes(turn_id) and not leftovers(scratch_root)

    await eventually(released, timeout=30, what="the stopped turn's sandbox released")
