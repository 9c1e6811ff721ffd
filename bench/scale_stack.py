"""The stacks of the stream-scale section (bench/stream_scale.py): one per checkout measured,
each its own embedded PostgreSQL, Temporal dev server, fake provider, worker and API; a user
per stream. Another commit runs from a `git archive` of it through bench/checkout.py."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import subprocess
import sys
import tempfile
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from temporalio.client import Client

from bench.cpu import Roles
from bench.stack import (
    LIFTED_LIMITS,
    REPO,
    Child,
    _postmaster_pid,
    _seed_and_token,
    _wait_ready,
    free_port,
    spawn,
    start_postgres,
    start_temporal,
    stop_everything,
)
from parley.config import Settings
from parley.dispatch.deployment import wait_promoted
from parley.store.db import Database, create_engine
from parley.store.identity import create_token
from parley.store.migrate import upgrade

LAUNCHER = REPO / "bench" / "checkout.py"


@dataclass
class ScaleStack:
    name: str
    api_url: str
    provider_url: str
    database_url: str
    tokens: list[str]  # a user each: one user's turns and streams share its locks and limits
    children: list[Child]
    postmaster: int | None

    def roles(self) -> Roles:
        by_pid = {os.getpid(): "bench_client"}
        by_pid |= {c.process.pid: c.name.split("-")[0] for c in self.children}
        by_parent = {os.getpid(): "temporal"}
        if self.postmaster is not None:
            by_pid[self.postmaster] = "postgres"
            by_parent[self.postmaster] = "postgres"
        return Roles(by_pid, by_parent)

    def check(self) -> None:
        for child in self.children:
            child.check()


def export_commit(commit: str, into: Path) -> Path:
    """The tree of `commit` (git archive: no worktree to clean up), with the link the
    editable install writes into the `parley` package (setup.py)."""
    into.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", "--format=tar", commit],
        check=True,
        capture_output=True,
    )
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    (into / "parley" / "worker.py").symlink_to("../worker.py")
    return into


def _module(root: Path | None, module: str, *args: str) -> list[str]:
    """`-m module args` for this checkout, or through the launcher for another's."""
    if root is None:
        return ["-m", module, *args]
    return [str(LAUNCHER), str(root), "-m", module, *args]


@contextlib.asynccontextmanager
async def scale_stack(
    name: str, root: Path | None, *, token_delay_ms: float, users: int
) -> AsyncIterator[ScaleStack]:
    """One stack of the checkout at `root` (None: this one), stopped and deleted on exit."""
    tmp = Path(tempfile.mkdtemp(prefix=f"parley-scale-{name}-"))
    pg = env = None
    children: list[Child] = []
    try:
        pg, database_url = await start_postgres(tmp)
        migrate_env = {**os.environ, "DATABASE_URL": database_url}
        # Alembic's INFO lines (a line per migration) are not the bench's report: kept out
        # of its output unless the migration fails.
        if root is None:
            logging.getLogger("alembic").setLevel(logging.WARNING)
            await asyncio.to_thread(upgrade, database_url)
        else:
            args = [sys.executable, *_module(root, "parley.launch.cli", "migrate")]
            migrated = await asyncio.to_thread(
                subprocess.run, args, env=migrate_env, cwd=root, capture_output=True, text=True
            )
            if migrated.returncode != 0:
                said = migrated.stdout[-1000:] + migrated.stderr[-2000:]
                raise RuntimeError(f"{name}: migrate failed\n{said}")
        await _seed_and_token(database_url)
        tokens = await _users(database_url, users)
        env = await start_temporal(eager=True, log_name=f"temporal-{name}")
        address = str(env.client.service_client.config.target_host)
        provider_port, api_port = free_port(), free_port()
        provider_url = f"http://127.0.0.1:{provider_port}"
        settings = Settings(
            database_url=database_url,
            temporal_address=address,
            task_queue=f"scale-{name}-{uuid.uuid4().hex[:6]}",
            worker_build_id=f"scale-{name}",
        )
        service_env = {
            **os.environ,
            "DATABASE_URL": database_url,
            "TEMPORAL_ADDRESS": address,
            "PARLEY_TASK_QUEUE": settings.task_queue,
            "PARLEY_WORKER_BUILD_ID": settings.worker_build_id,
            "PARLEY_MODEL_PROVIDER": "openai",
            "PARLEY_MODEL": "gpt-stream",
            "OPENAI_BASE_URL": provider_url + "/v1",
            "OPENAI_API_KEY": "bench-local-server",
            **LIFTED_LIMITS,
        }
        provider = spawn(
            f"provider-{name}",
            ["-m", "parley.gateway.fake_provider", "--port", str(provider_port)]
            + ["--token-delay-ms", str(token_delay_ms)],
            service_env,
        )
        children.append(provider)
        await _wait_ready(provider_url + "/_fake/requests", provider)
        worker = spawn(f"worker-{name}", _module(root, "parley.launch.cli", "worker"), service_env)
        children.append(worker)
        api_args = ["api", "--host", "127.0.0.1", "--port", str(api_port)]
        api = spawn(f"api-{name}", _module(root, "parley.launch.cli", *api_args), service_env)
        children.append(api)
        api_url = f"http://127.0.0.1:{api_port}"
        await _wait_ready(api_url + "/readyz", api)
        await wait_promoted(await Client.connect(address), settings, 60)
        yield ScaleStack(
            name,
            api_url,
            provider_url,
            database_url,
            tokens,
            children,
            _postmaster_pid(pg.pgdata),
        )
    finally:
        await stop_everything(children, env, pg, tmp)


async def _users(database_url: str, count: int) -> list[str]:
    """A token for each of `count` customers of the demo tenant, made for the run."""
    engine = create_engine(database_url, pool_size=1)
    try:
        async with Database(engine)() as db:
            await db.run(_USERS, {"count": count})
            tokens = [
                await create_token(db, tenant_id="northwind", user_id=f"scale_{i}")
                for i in range(count)
            ]
            await db.commit()
            return tokens
    finally:
        await engine.dispose()


_USERS = """
    INSERT INTO users (tenant_id, id, display_name)
    SELECT 'northwind', 'scale_' || i, 'Scale ' || i FROM generate_series(0, %(count)s - 1) AS i
"""
