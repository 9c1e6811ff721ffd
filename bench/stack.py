"""Stand up Parley and the baseline for one bench run, and tear everything down afterwards.

Embedded PostgreSQL (in a temporary folder) and the Temporal dev server run as their own
processes, as do the Parley worker, the Parley API and the baseline server, so the bench
client's event loop shares no CPU time with any server loop.
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
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import httpx
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

from bench.cpu import Roles
from dispatch.deployment import build_id, wait_promoted
from launch.dev import EAGER_ACTIVITIES, temporal_cli
from parley.config import Settings
from parley.contracts import SEARCH_ATTRIBUTES
from store.db import create_engine, session_factory
from store.embedded import EmbeddedPostgres
from store.identity import create_token, seed_demo
from store.migrate import upgrade

REPO = Path(__file__).resolve().parent.parent
LOG_DIR = REPO / ".data" / "bench" / "logs"


def log(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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
        """Which process is which, for CPU accounting."""
        by_pid = {os.getpid(): "bench_client"} | {c.process.pid: c.name for c in self.children}
        by_parent = {os.getpid(): "temporal"}  # our only other child: the Temporal dev server
        if self.postmaster_pid is not None:
            by_pid[self.postmaster_pid] = "postgres"
            by_parent[self.postmaster_pid] = "postgres"
        return Roles(by_pid, by_parent)


def _spawn(name: str, args: list[str], env: dict[str, str]) -> Child:
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    log_path = LOG_DIR / f"{name}.log"
    log_file = log_path.open("wb")
    process = subprocess.Popen(
        [sys.executable, *args],
        env=env,
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        stdout=log_file,
        stderr=subprocess.STDOUT,
    )
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
        async with session_factory(engine)() as db:
            await seed_demo(db)
            await db.commit()
        async with session_factory(engine)() as db:
            token = await create_token(db, tenant_id="northwind", user_id="cust_2291")
            await db.commit()
            return token
    finally:
        await engine.dispose()


async def _start_temporal(eager: bool) -> WorkflowEnvironment:
    """`WorkflowEnvironment.start_local`, with the dev server's banner and logs sent to a log
    file instead of our stdout (the server inherits fd 1 when it is spawned)."""
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    saved = os.dup(1)
    with (LOG_DIR / "temporal.log").open("wb") as server_log:
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


@contextlib.asynccontextmanager
async def running_stack(token_delay_ms: float, *, eager: bool = True) -> AsyncIterator[Stack]:
    """Everything up, yielded as a `Stack`; everything stopped and deleted on exit."""
    tmp = Path(tempfile.mkdtemp(prefix="parley-bench-"))
    pg = EmbeddedPostgres(tmp / "pg" / "data")
    env: WorkflowEnvironment | None = None
    children: list[Child] = []
    try:
        log(f"starting embedded PostgreSQL in {tmp}")
        database_url = await asyncio.to_thread(pg.start)
        await asyncio.to_thread(upgrade, database_url)
        token = await _seed_and_token(database_url)

        log("starting the Temporal dev server")
        env = await _start_temporal(eager)
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
            # One user drives every concurrent session here; lift the per-user limits.
            "PARLEY_MAX_STREAMS_PER_USER": "1000",
            "PARLEY_MAX_ACTIVE_TURNS_PER_USER": "100000",
            "PARLEY_USER_REQUESTS_PER_MINUTE": "1000000",
            "PARLEY_TENANT_REQUESTS_PER_MINUTE": "1000000",
            "PARLEY_MAX_SESSIONS_PER_USER_PER_DAY": "1000000",
            "PARLEY_USER_DAILY_MESSAGES": "0",
            "PARLEY_WORKER_METRICS_PORT": "0",
            "PYTHONUNBUFFERED": "1",
        }
        api_port, baseline_port, backend_port = free_port(), free_port(), free_port()
        # The Northwind demo backend, so the scripted conversations get real tool results
        # (without it every lookup fails and the memory figures measure error replies).
        settings.northwind_url = f"http://127.0.0.1:{backend_port}"
        service_env["PARLEY_NORTHWIND_URL"] = settings.northwind_url
        log("starting the demo backend, the Parley worker, the Parley API and the baseline")
        backend = _spawn(
            "demo-backend",
            ["-m", "launch.cli", "demo-backend", "--host", "127.0.0.1"]
            + ["--port", str(backend_port)],
            service_env,
        )
        children.append(backend)
        await _wait_ready(settings.northwind_url + "/healthz", backend)
        # One build id for the worker and the wait below (the worker is versioned by default).
        service_env["PARLEY_WORKER_BUILD_ID"] = settings.worker_build_id = build_id(settings)
        worker = _spawn("worker", ["-m", "launch.cli", "worker"], service_env)
        children.append(worker)
        api = _spawn(
            "api",
            ["-m", "launch.cli", "api", "--host", "127.0.0.1", "--port", str(api_port)],
            service_env,
        )
        children.append(api)
        baseline = _spawn(
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
            _spawn(
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
            _postmaster_pid(pg.pgdata),
            children,
            skeleton_queue,
            service_env,
        )
    finally:
        log("stopping everything")
        for child in reversed(children):
            with contextlib.suppress(Exception):
                _stop(child)
        if env is not None:
            with contextlib.suppress(Exception):
                await env.shutdown()
        with contextlib.suppress(Exception):
            await asyncio.to_thread(pg.stop)
        shutil.rmtree(tmp, ignore_errors=True)


@dataclass(frozen=True)
class ProviderStack:
    """A second Parley (worker and API on a task queue and deployment of their own) whose
    gateway speaks OpenAI's wire format to a local server, beside the bench's stack."""

    settings: Settings
    parley_url: str
    provider_url: str  # the local OpenAI-compatible server (its `/_fake/requests` too)
    model: str


@contextlib.asynccontextmanager
async def provider_stack(
    stack: Stack, *, summarizer: str = "plain", model: str = "gpt-plain"
) -> AsyncIterator[ProviderStack]:
    """The real stack through a real provider's wire format: `python -m gateway.fake_provider
    --brain` answers turns as the demo model would, and the rolling summary's requests as
    `summarizer` says (`plain`: prose, never the JSON asked for). Stopped on exit."""
    delay_ms = str(stack.settings.demo_token_delay_ms)
    provider_port, api_port = free_port(), free_port()
    provider_url = f"http://127.0.0.1:{provider_port}"
    queue = f"bench-{summarizer}-{uuid.uuid4().hex[:8]}"
    deployment = f"parley-{summarizer}"
    env = {
        **stack.env,
        "PARLEY_MODEL_PROVIDER": "openai",
        "PARLEY_MODEL": model,
        "OPENAI_BASE_URL": provider_url + "/v1",
        "OPENAI_API_KEY": "bench-local-server",
        "PARLEY_TASK_QUEUE": queue,
        "PARLEY_WORKER_DEPLOYMENT": deployment,
    }
    children: list[Child] = []
    try:
        provider = _spawn(
            f"provider-{summarizer}",
            ["-m", "gateway.fake_provider", "--brain", "--summarizer", summarizer]
            + ["--port", str(provider_port), "--token-delay-ms", delay_ms],
            env,
        )
        children.append(provider)
        await _wait_ready(provider_url + "/_fake/requests", provider)
        children.append(_spawn(f"worker-{summarizer}", ["-m", "launch.cli", "worker"], env))
        api = _spawn(
            f"api-{summarizer}",
            ["-m", "launch.cli", "api", "--host", "127.0.0.1", "--port", str(api_port)],
            env,
        )
        children.append(api)
        parley_url = f"http://127.0.0.1:{api_port}"
        await _wait_ready(parley_url + "/readyz", api)
        settings = stack.settings.model_copy(
            update={
                "task_queue": queue,
                "worker_deployment": deployment,
                "model_provider": "openai",
                "model": model,
            }
        )
        client = await Client.connect(settings.temporal_address)
        await wait_promoted(client, settings, 60)
        yield ProviderStack(settings, parley_url, provider_url, model)
    finally:
        for child in reversed(children):
            with contextlib.suppress(Exception):
                _stop(child)
