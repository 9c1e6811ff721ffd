"""`parley migrate` run by several processes at once (every pod of a deployment runs it on
start: deploy/kubernetes): the first upgrades, the others wait for it and find nothing to
do; none fails and the schema ends at the head once."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
from alembic.script import ScriptDirectory

from parley.store.db import libpq_url
from parley.store.migrate import alembic_config


def _with_database(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{name}"))


@pytest.fixture
def empty_database(database_url: str) -> Iterator[str]:
    name = f"migrate_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(libpq_url(database_url), autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield _with_database(database_url, name)
    finally:
        with psycopg.connect(libpq_url(database_url), autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_three_migrations_at_once_upgrade_the_schema_once(empty_database: str) -> None:
    # Processes, as pods are: alembic's context is one per process.
    env = {**os.environ, "DATABASE_URL": empty_database, "PARLEY_ENV": "dev"}
    command = [sys.executable, "-m", "parley.launch.cli", "migrate"]
    runs = [
        subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        for _ in range(3)
    ]
    outputs = [run.communicate(timeout=150)[0].decode() for run in runs]
    assert [run.returncode for run in runs] == [0, 0, 0], "\n---\n".join(outputs)
    head = ScriptDirectory.from_config(alembic_config(empty_database)).get_current_head()
    with psycopg.connect(libpq_url(empty_database)) as conn:
        versions = conn.execute("SELECT version_num FROM alembic_version").fetchall()
        assert versions == [(head,)]
        sessions = conn.execute("SELECT to_regclass('sessions') IS NOT NULL").fetchone()
        assert sessions == (True,)
