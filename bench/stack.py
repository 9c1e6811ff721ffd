"""Stand up Parley and the baseline for one bench run, and tear everything down afterwards.

Embedded PostgreSQL (in a temporary folder) and the Temporal dev server run as their own
processes, as do the Parley worker, the Parley API and the baseline server, so the bench
client's event loop shares no CPU time with any server loop.

A bench that is killed (SIGTERM, SIGKILL, an OOM kill) runs no teardown, so its processes
are guarded as `parley dev`'s are (launch/lifeline.py, `guard`): every child the bench spawns
runs in a process group of its own and gets SIGKILL when the bench dies, and a watchman
started first kills what is left when the bench is gone, however it went: each child's
group, the embedded PostgreSQL server (a daemon `pg_ctl` started, nobody's child) and the
Temporal dev servers the SDK started.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import IO

import httpx
import psutil
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

from bench.cpu import Roles
from parley.config import Settings
from parley.contracts import SEARCH_ATTRIBUTES
from parley.dispatch.deployment import build_id, wait_promoted
from parley.launch.dev import EAGER_ACTIVITIES, temporal_cli
from parley.launch.lifeline import Lifeline, die_with_parent
from parley.store.db import Database, create_engine
from parley.store.embedded import EmbeddedPostgres
from parley.store.identity import create_token, seed_demo
from parley.store.migrate import upgrade

REPO = Path(__file__).resolve().parent.parent
LOG_DIR = REPO / ".data" / "bench" / "logs"


def log(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Guard:
    """The bench's end of its watchman (launch/lifeline.py): what it is told to watch is
    killed when the bench process ends without stopping it."""

    def __init__(self) -> None:
        self.lifeline = Lifeline()
        self._servers: set[int] = set()

    def watch_child(self, pid: int) -> None:
        """A child started in a process group of its own: the whole group."""
        self.lifeline.watch(pid)

    def watch_postgres(self, pid: int | None) -> None:
        if pid is not None:
            self.lifeline.watch(pid, how="postgres")

    def watch_dev_servers(self) -> None:
        """The Temporal dev servers the SDK started for this process (`start_local` spawns
        them as our children, in our own process group), each with what it started."""
        for child in psutil.Process().children():
            with contextlib.suppress(psutil.Error):
                if child.pid not in self._servers and "start-dev" in child.cmdline():
                    self.lifeline.watch(child.pid, how="process")
                    self._servers.add(child.pid)


_guard: Guard | None = None


def guard() -> Guard:
    """This process's guard, its watchman started on first use: one for the whole bench run
    (the stack, a provider stack beside it, the eager-start section's own dev server). It is
    never closed: the pipe closes when the bench exits, and a watchman that finds everything
    stopped just exits."""
    global _guard
    if _guard is None:
        _guard = Guard()
    return _guard


@dataclass
class Child:
    name: str
    process: subprocess.Popen[bytes]
    log_path: Path
    log_file: IO[bytes]

    def check(self) -> None:
        code = self.process.poll()
        if code is not None:
            raise RuntimeError(
                f"{self.name} exited with code {code}; last lines of {self.log_path}:\n"
                + tail(self.log_path)
            )


def tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


@dataclass
class Stack:
    settings: Settings
    parley_url: str
    baseline_url: str
    token: str
    postmaster_pid: int | None
    children: list[Child] = field(default_factory=list)
    skeleton_queue: str = ""  # the skeleton floor's worker (bench/skeleton.py) polls this
    env: dict[str, str] = field(default_factory=dict)  # the services' environment

    def check(self) -> None:
        for child in self.children:
            child.check()

    def roles(self) -> Roles:
        """Which process is which, for CPU accounting (the watchman is the bench's own)."""
        by_pid = {os.getpid(): "bench_client", guard().lifeline.pid: "bench_client"}
        by_pid |= {c.process.pid: c.name for c in self.children}
        by_parent = {os.getpid(): "temporal"}  # our only other child: the Temporal dev server
        if self.postmaster_pid is not None:
            by_pid[self.postmaster_pid] = "postgres"
            by_parent[self.postmaster_pid] = "postgres"
        return Roles(by_pid, by_parent)


def spawn(name: str, args: list[str], env: dict[str, str]) -> Child:
    """`python args…` in a process group of its own, logging to `LOG_DIR/<name>.log`,
    guarded: it dies with the bench."""
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    log_path = LOG_DIR / f"{name}.log"
    log_file = log_path.open("wb")
    watching = guard()  # the watchman first: it must not be this child's child
    process = subprocess.Popen(
        [sys.executable, *args],
        env=env,
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        stdout=log_file,
        stderr=subprocess.STDOUT,
        process_group=0,  # a terminal's Ctrl-C is the bench's to handle, in order
        preexec_fn=partial(die_with_parent, os.getpid()),
    )
    watching.watch_child(process.pid)
    return Child(name, process, log_path, log_file)


def _stop(child: Child, timeout: float = 15.0) -> None:
    if child.process.poll() is None:
        child.process.terminate()
        try:
            child.process.wait(timeout)
        except subprocess.TimeoutExpired:
            child.process.kill()
            child.process.wait()
    child.log_file.close()


async def stop_everything(
    children: list[Child],
    env: WorkflowEnvironment | None,
    pg: EmbeddedPostgres | None,
    tmp: Path,
) -> None:
    """A stack's teardown, each part whatever became of the others: its processes (newest
    first), the Temporal dev server, PostgreSQL, then its folder."""
    for child in reversed(children):
        with contextlib.suppress(Exception):
            _stop(child)
    if env is not None:
        with contextlib.suppress(Exception):
            await env.shutdown()
    if pg is not None:
        with contextlib.suppress(Exception):
            await asyncio.to_thread(pg.stop)
    shutil.rmtree(tmp, ignore_errors=True)


async def _wait_ready(url: str, child: Child, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient(timeout=5) as http:
        while True:
            child.check()
            with contextlib.suppress(httpx.HTTPError):
                if (await http.get(url)).status_code == 200:
                    return
            if time.monotonic() > deadline:
                raise RuntimeError(f"{child.name} not ready at {url} after {timeout:.0f}s")
            await asyncio.sleep(0.1)


def _postmaster_pid(pgdata: Path) -> int | None:
    try:
        return int((pgdata / "postmaster.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


async def _seed_and_token(database_url: str) -> str:
    engine = create_engine(database_url, pool_size=1)
    try:
        async with Database(engine)() as db:
            await seed_demo(db)
            await db.commit()
        async with Database(engine)() as db:
            token = await create_token(db, tenant_id="northwind", user_id="cust_2291")
            await db.commit()
            return token
    finally:
        await engine.dispose()


async def start_temporal(eager: bool, log_name: str = "temporal") -> WorkflowEnvironment:
    """`WorkflowEnvironment.start_local`, guarded, with the dev server's banner and logs sent
    to `LOG_DIR/<log_name>.log` instead of our stdout (the server inherits fd 1 when it is
    spawned)."""
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    watching = guard()
    sys.stdout.flush()
    saved = os.dup(1)
    with (LOG_DIR / f"{log_name}.log").open("wb") as server_log:
        os.dup2(server_log.fileno(), 1)
        try:
            return await WorkflowEnvironment.start_local(
                dev_server_existing_path=temporal_cli(),
                search_attributes=SEARCH_ATTRIBUTES,
                dev_server_log_level="error",
                dev_server_extra_args=list(EAGER_ACTIVITIES) if eager else [],
            )
        finally:
            os.dup2(saved, 1)
            os.close(saved)
            watching.watch_dev_servers()


# One user drives every concurrent session of a bench: its per-user and per-tenant limits
# are lifted (and the worker's metrics port is left to the OS).
LIFTED_LIMITS = {
    "PARLEY_MAX_STREAMS_PER_USER": "100000",
    "PARLEY_MAX_ACTIVE_TURNS_PER_USER": "100000",
    "PARLEY_USER_REQUESTS_PER_MINUTE": "1000000",
    "PARLEY_TENANT_REQUESTS_PER_MINUTE": "1000000",
    "PARLEY_MAX_SESSIONS_PER_USER_PER_DAY": "1000000",
    "PARLEY_USER_DAILY_MESSAGES": "0",
    "PARLEY_WORKER_METRICS_PORT": "0",
    "PYTHONUNBUFFERED": "1",
}


async def start_postgres(folder: Path) -> tuple[EmbeddedPostgres, str]:
    """Embedded PostgreSQL with its data under `folder`, guarded; returns it and its URL."""
    pg = EmbeddedPostgres(folder / "pg" / "data")
    database_url = await asyncio.to_thread(pg.start)
    guard().watch_postgres(pg.pid)
    return pg, database_url


@contextlib.asynccontextmanager
async def running_stack(token_delay_ms: float, *, eager: bool = True) -> AsyncIterator[Stack]:
    """Everything up, yielded as a `Stack`; everything stopped and deleted on exit."""
    tmp = Path(tempfile.mkdtemp(prefix="parley-bench-"))
    pg: EmbeddedPostgres | None = None
    env: WorkflowEnvironment | None = None
    children: list[Child] = []
    try:
        log(f"starting embedded PostgreSQL in {tmp}")
        pg, database_url = await start_postgres(tmp)
        postmaster = _postmaster_pid(pg.pgdata)
        await asyncio.to_thread(upgrade, database_url)
        token = await _seed_and_token(database_url)

        log("starting the Temporal dev server")
        env = await start_temporal(eager)
        temporal_address = str(env.client.service_client.config.target_host)

        settings = Settings(
            database_url=database_url,
            temporal_address=temporal_address,
            task_queue=f"bench-{uuid.uuid4().hex[:8]}",
            demo_token_delay_ms=token_delay_ms,
        )
        service_env = {
            **os.environ,
            "DATABASE_URL": database_url,
            "TEMPORAL_ADDRESS": temporal_address,
            "PARLEY_TASK_QUEUE": settings.task_queue,
            "PARLEY_DEMO_TOKEN_DELAY_MS": str(token_delay_ms),
            **LIFTED_LIMITS,
            "PARLEY_MAX_STREAMS_PER_USER": "1000",
        }
        api_port, baseline_port, backend_port = free_port(), free_port(), free_port()
        # The Northwind demo backend, so the scripted conversations get real tool results
        # (without it every lookup fails and the memory figures measure error replies).
        settings.northwind_url = f"http://127.0.0.1:{backend_port}"
        service_env["PARLEY_NORTHWIND_URL"] = settings.northwind_url
        log("starting the demo backend, the Parley worker, the Parley API and the baseline")
        backend = spawn(
            "demo-backend",
            ["-m", "parley.launch.cli", "demo-backend", "--host", "127.0.0.1"]
            + ["--port", str(backend_port)],
            service_env,
        )
        children.append(backend)
        await _wait_ready(settings.northwind_url + "/healthz", backend)
        # One build id for the worker and the wait below (the worker is versioned by default).
        service_env["PARLEY_WORKER_BUILD_ID"] = settings.worker_build_id = build_id(settings)
        worker = spawn("worker", ["-m", "parley.launch.cli", "worker"], service_env)
        children.append(worker)
        api = spawn(
            "api",
            ["-m", "parley.launch.cli", "api", "--host", "127.0.0.1", "--port", str(api_port)],
            service_env,
        )
        children.append(api)
        baseline = spawn(
            "baseline",
            [
                "-m",
                "bench.baseline",
                "--port",
                str(baseline_port),
                "--token-delay-ms",
                str(token_delay_ms),
            ],
            {**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        children.append(baseline)
        skeleton_queue = f"skeleton-{uuid.uuid4().hex[:8]}"
        children.append(
            spawn(
                "skeleton-worker",
                ["-m", "bench.skeleton", "--address", temporal_address]
                + ["--task-queue", skeleton_queue],
                service_env,
            )
        )
        parley_url = f"http://127.0.0.1:{api_port}"
        baseline_url = f"http://127.0.0.1:{baseline_port}"
        await _wait_ready(parley_url + "/readyz", api)
        await _wait_ready(baseline_url + "/healthz", baseline)
        worker.check()
        # The worker is versioned (the default): no turn before its build is current.
        await wait_promoted(env.client, settings, 60)
        yield Stack(
            settings,
            parley_url,
            baseline_url,
            token,
            postmaster,
            children,
            skeleton_queue,
            service_env,
        )
    finally:
        log("stopping everything")
        await stop_everything(children, env, pg, tmp)


@dataclass(frozen=True)
class SideStack:
    """A second Parley (worker and API on a task queue and deployment of their own, on the
    bench's database and Temporal) whose settings differ from the stack's by `env`."""

    settings: Settings
    parley_url: str


@contextlib.asynccontextmanager
async def side_stack(
    stack: Stack, name: str, env: dict[str, str], update: Mapping[str, object]
) -> AsyncIterator[SideStack]:
    """A worker and an API beside the stack's, with the stack's environment plus `env` (and
    `update`, the same changes as settings): for figures of another configuration measured
    in the same run. Stopped on exit."""
    api_port = free_port()
    queue = f"bench-{name}-{uuid.uuid4().hex[:8]}"
    deployment = f"parley-{name}"
    env = {**stack.env, **env, "PARLEY_TASK_QUEUE": queue, "PARLEY_WORKER_DEPLOYMENT": deployment}
    children: list[Child] = []
    try:
        children.append(spawn(f"worker-{name}", ["-m", "parley.launch.cli", "worker"], env))
        api = spawn(
            f"api-{name}",
            ["-m", "parley.launch.cli", "api", "--host", "127.0.0.1", "--port", str(api_port)],
            env,
        )
        children.append(api)
        parley_url = f"http://127.0.0.1:{api_port}"
        await _wait_ready(parley_url + "/readyz", api)
        settings = stack.settings.model_copy(
            update={**update, "task_queue": queue, "worker_deployment": deployment}
        )
        client = await Client.connect(settings.temporal_address)
        await wait_promoted(client, settings, 60)
        yield SideStack(settings, parley_url)
    finally:
        for child in reversed(children):
            with contextlib.suppress(Exception):
                _stop(child)


@dataclass(frozen=True)
class ProviderStack:
    """A second Parley (`side_stack`) whose gateway speaks OpenAI's wire format to a local
    server, beside the bench's stack."""

    settings: Settings
    parley_url: str
    provider_url: str  # the local OpenAI-compatible server (its `/_fake/requests` too)
    model: str


@contextlib.asynccontextmanager
async def provider_stack(
    stack: Stack, *, summarizer: str = "plain", model: str = "gpt-plain"
) -> AsyncIterator[ProviderStack]:
    """The real stack through a real provider's wire format: `python -m parley.gateway.fake_provider
    --brain` answers turns as the demo model would, and the rolling summary's requests as
    `summarizer` says (`plain`: prose, never the JSON asked for). Stopped on exit."""
    delay_ms = str(stack.settings.demo_token_delay_ms)
    provider_port = free_port()
    provider_url = f"http://127.0.0.1:{provider_port}"
    env = {
        "PARLEY_MODEL_PROVIDER": "openai",
        "PARLEY_MODEL": model,
        "OPENAI_BASE_URL": provider_url + "/v1",
        "OPENAI_API_KEY": "bench-local-server",
    }
    provider = spawn(
        f"provider-{summarizer}",
        ["-m", "parley.gateway.fake_provider", "--brain", "--summarizer", summarizer]
        + ["--port", str(provider_port), "--token-delay-ms", delay_ms],
        {**stack.env, **env},
    )
    try:
        await _wait_ready(provider_url + "/_fake/requests", provider)
        update = {"model_provider": "openai", "model": model}
        async with side_stack(stack, summarizer, env, update) as side:
            yield ProviderStack(side.settings, side.parley_url, provider_url, model)
    finally:
        with contextlib.suppress(Exception):
            _stop(provider)
