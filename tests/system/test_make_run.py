"""`make run` as a user and an SRE meet it: the printed curl example streams a reply; the `ai`
package's own client holds Priya's conversation through the AI SDK endpoint (acceptance 1 of
issue 44, tests/node/chat.test.mjs); the CLI finds the running database by itself; a worker
killed mid-answer or drained with SIGTERM is replaced while the API stays up and the answer
completes once; Ctrl-C stops all.

Runs `parley dev` (what `make run` runs after installing) once for the module, on free ports
with its own data folder, exactly as a user would. The last test presses Ctrl-C.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator

import httpx
import psutil
import pytest
from temporalio.client import Client

from parley.dispatch.deployment import current_build
from parley.ids import workflow_id_for_turn
from tests.support.ai_client import ChatTarget, installed_client, passed, run_chat_client
from tests.support.client import ParleyClient, streamed_text
from tests.support.dev_run import CLI, DevRun, dev_running, port_is_open
from tests.support.processes import read_until
from tests.support.stack import REPO
from tests.support.toolkit import eventually

# A policy question: the demo model quotes the policy, the longest answer it gives (about 70
# tokens, near 3 s at this run's pace), so a Stop or a dropped connection lands mid-answer.
LONG_QUESTION = "How long do refunds take?"


@pytest.fixture(scope="module")
def dev(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevRun]:
    # A Stop cancels 1 s after the client hung up (3 s by default), well before the answer ends.
    with dev_running(tmp_path_factory.mktemp("dev"), PARLEY_AI_SDK_STOP_GRACE_S="1") as run:
        yield run


async def test_dev_start_prints_urls_and_a_token_and_its_curl_streams_a_reply(
    dev: DevRun,
) -> None:
    text = "\n".join(dev.banner)
    assert f"http://127.0.0.1:{dev.ports['api']}/" in text
    assert f"http://127.0.0.1:{dev.ports['ui']}/" in text
    assert "Token for Priya" in text
    assert port_is_open(dev.ports["ui"]), "the Temporal Web UI is not listening"
    assert f"http://127.0.0.1:{dev.ports['backend']}/" in text
    assert port_is_open(dev.ports["metrics"]), "the worker's metrics port is not listening"

    curl = dev.banner[-1].strip()
    result = subprocess.run(
        ["bash", "-c", curl], capture_output=True, text=True, timeout=60, env=dev.env
    )
    assert result.returncode == 0, result.stderr
    assert "event: delta" in result.stdout
    assert "event: done" in result.stdout
    assert "8472" in result.stdout

    # The worker's metrics port serves the SDK's metrics beside the app's own.
    async def both_kinds() -> str | None:
        async with httpx.AsyncClient() as http:
            text = (await http.get(f"http://127.0.0.1:{dev.ports['metrics']}/metrics")).text
        app = 'parley_model_calls_total{model="demo-1",outcome="ok"' in text
        return text if app and "temporal_workflow_task_schedule_to_start_latency" in text else None

    scraped = await eventually(both_kinds, timeout=10, what="the app's and the SDK's metrics")
    for sdk_metric in ("temporal_worker_task_slots_available", "temporal_sticky_cache_size"):
        assert sdk_metric in scraped


async def test_the_use_chat_example_page_is_served_as_built(dev: DevRun) -> None:
    """The useChat example (docs/features/ai-sdk.md): its page and its committed bundle, from
    the installed package; nothing is built at run time."""
    base = f"http://127.0.0.1:{dev.ports['api']}"
    async with httpx.AsyncClient(base_url=base) as http:
        page = await http.get("/examples/use-chat")
        bundle = await http.get("/static/examples/use-chat.js")
    assert page.status_code == 200 and "/static/examples/use-chat.js" in page.text
    assert bundle.status_code == 200 and "javascript" in bundle.headers["content-type"]
    assert "/v1/ai-sdk/chat" in bundle.text


async def test_the_ai_client_holds_priyas_conversation_against_make_run(dev: DevRun) -> None:
    """Acceptance 1 of the AI SDK endpoint, against the stack `make run` starts: the `ai`
    package's own client (tests/node/chat.test.mjs, as tests/node runs it in process)."""
    folder = installed_client()  # before the clock of any answer starts
    sam = subprocess.run(
        [*CLI, "token", "create", "--tenant", "northwind", "--user", "agent_sam"],
        cwd=REPO,
        env=dev.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert sam.returncode == 0, sam.stderr
    backend = f"http://127.0.0.1:{dev.ports['backend']}"
    target = ChatTarget(dev.api, dev.priya_token, sam.stdout.strip(), backend, LONG_QUESTION)
    report = await run_chat_client(folder, target)
    assert passed(report) == 5, report


async def test_token_create_finds_the_running_dev_database_by_itself(dev: DevRun) -> None:
    # Nothing but the data folder (the default `.data` for a real user) points at the server.
    assert "DATABASE_URL" not in dev.env
    result = subprocess.run(
        [*CLI, "token", "create", "--tenant", "northwind", "--user", "cust_3301"],
        cwd=REPO,
        env=dev.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    token = result.stdout.strip()
    assert token.startswith("pk_")
    marco = ParleyClient(dev.api, token)
    try:
        session_id = await marco.new_session()
        turn_id, events = await marco.turn(session_id, "Where is my order?")
        assert events[-1].type == "done", [e.type for e in events]
    finally:
        await marco.aclose()
    # The worker `make run` starts is a version of the "parley" deployment, the turn pinned
    # to this checkout's build.
    temporal = await Client.connect(f"127.0.0.1:{dev.ports['temporal']}")
    described = await temporal.get_workflow_handle(workflow_id_for_turn(turn_id)).describe()
    info = described.raw_description.workflow_execution_info.versioning_info
    assert info.behavior == 1, info  # VERSIONING_BEHAVIOR_PINNED
    assert info.deployment_version.deployment_name == "parley"
    assert info.deployment_version.build_id == await current_build(temporal, "parley"), info
    assert info.deployment_version.build_id.startswith("0.1.0+"), info  # version + commit


async def test_a_script_that_waits_for_healthz_can_create_a_token(dev: DevRun) -> None:
    # `dev.json` is there before the API answers (the workers may still be starting).
    assert dev.early["dev_json"] is True
    result = dev.early["token"]
    assert isinstance(result, subprocess.CompletedProcess)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().startswith("pk_")
    marco = ParleyClient(dev.api, result.stdout.strip())
    try:
        assert (await marco.new_session()).startswith("ses_")
    finally:
        await marco.aclose()


async def test_the_demo_tenants_mcp_server_is_on_the_allow_list(dev: DevRun) -> None:
    # The demo backend's MCP server is on loopback, which only a listed host may be: `parley
    # dev` lists the backend it starts, so store hours come from it, with no warning.
    client = ParleyClient(dev.api, dev.priya_token)
    try:
        session_id = await client.new_session()
        _, events = await client.turn(session_id, "What are your store hours in Seattle?")
    finally:
        await client.aclose()
    assert [e.data for e in events if e.type == "warning"] == []
    assert "Mon-Sat 09:00-20:00" in streamed_text(events), [e.type for e in events]


async def test_worker_killed_mid_answer_is_replaced_and_the_answer_completes_once(
    dev: DevRun,
) -> None:
    api_pid = dev.child_pid("api")
    client = ParleyClient(dev.api, dev.priya_token)
    try:
        session_id = await client.new_session()
        posted = await client.post(session_id, "Tell me about yourself, please.")
        assert posted.status_code == 202, posted.text
        url = posted.json()["events_url"]
        before = await read_until(client, url, after=0, stop="delta")
        assert before[-1].type == "delta", [e.type for e in before]

        [victim] = dev.workers()
        victim.send_signal(signal.SIGKILL)  # `kill -9`
        killed_at = time.monotonic()

        async def replacement() -> list[psutil.Process]:
            return [w for w in dev.workers() if w.pid != victim.pid]

        await eventually(replacement, timeout=20, what="a new worker process")
        await eventually(
            lambda: _async(port_is_open(dev.ports["metrics"])),
            timeout=20,
            what="the new worker connected (its metrics port open)",
        )
        print(f"\nnew worker polling {time.monotonic() - killed_at:.1f} s after kill -9")

        after = await read_until(client, url, after=before[-1].id or 0, stop="done")
        events = before + after
        assert [e.id for e in events] == list(range(1, len(events) + 1))
        kinds = [e.type for e in events]
        assert kinds[-1] == "done", kinds
        assert "reset" in kinds and "delta" in kinds[kinds.index("reset") :]
        final = events[-1].data["message"]
        assert streamed_text(events) == final["text"]

        stored = [m for m in await client.messages(session_id) if m["role"] == "assistant"]
        assert [m["text"] for m in stored] == [final["text"]]
        assert dev.child_pid("api") == api_pid, "the API was restarted too"
        assert "worker-1 (pid" in dev.log.read_text(), "no log line about the restart"
    finally:
        await client.aclose()


async def test_sigterm_drains_a_worker_and_the_supervisor_starts_another(dev: DevRun) -> None:
    [drained] = dev.workers()
    drained.send_signal(signal.SIGTERM)

    async def clean_exit() -> bool:
        return f"(pid {drained.pid}) exit code 0; restarting" in dev.log.read_text()

    await eventually(clean_exit, timeout=30, what="the drained worker exiting cleanly")

    async def replacement() -> list[psutil.Process]:
        return [w for w in dev.workers() if w.pid != drained.pid]

    await eventually(replacement, timeout=20, what="a worker started after the drain")
    client = ParleyClient(dev.api, dev.priya_token)
    try:
        session_id = await client.new_session()
        _, events = await client.turn(session_id, "Where is my order?")
        assert events[-1].type == "done", [e.type for e in events]
    finally:
        await client.aclose()


def test_ctrl_c_stops_everything_and_leaves_no_process_or_port(dev: DevRun) -> None:
    dev.process.send_signal(signal.SIGINT)  # what Ctrl-C sends
    try:
        dev.process.wait(60)
    finally:
        if dev.process.poll() is None:
            os.killpg(dev.process.pid, signal.SIGKILL)
    assert dev.process.returncode == 0, dev.story()
    for port in dev.ports.values():
        assert not port_is_open(port), f"port {port} still open after Ctrl-C"
    assert not (dev.data_dir / "dev.json").exists(), "the CLI would find a stopped server"
    leftovers = [
        p.info["name"]
        for p in psutil.process_iter(["name", "cmdline"])
        if any(str(dev.data_dir) in part for part in p.info["cmdline"] or ())
    ]
    assert leftovers == [], "processes left running after Ctrl-C"
    # The supervisor's children: none survives it (they are in their own process groups).
    assert not any(_is_dev_child(p, dev) for p in psutil.process_iter(["environ"]))


def _is_dev_child(process: psutil.Process, dev: DevRun) -> bool:
    try:
        return (process.info.get("environ") or {}).get("PARLEY_DATA_DIR") == str(dev.data_dir)
    except psutil.Error:
        return False


async def _async(value: bool) -> bool:
    return value
