"""Where the running `parley dev` put things, so the CLI finds them with no extra environment.

`parley dev` writes `dev.json` into the data folder as soon as its database is migrated (before
the API answers, so a script that waits for `/healthz` finds it) and removes it when it stops.
It names the embedded PostgreSQL server's URL (a Unix socket inside the data folder, trust
authentication: no password exists to leak), the Temporal address and the demo backend.
An external `DATABASE_URL` is never written: it may carry a password.

Every `parley` command reads it through `with_dev_services`; a variable set in the environment
always wins over the file, and a file left behind by a supervisor that was killed is ignored.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

from parley.config import Settings
from parley.egress import Origin

STATE_FILE = "dev.json"

# The settings `parley dev` may hand on, by field name.
_SHARED = ("database_url", "temporal_address", "northwind_url")


def state_path(settings: Settings) -> Path:
    return settings.data_dir / STATE_FILE


def write_dev_state(settings: Settings, *, embedded_database: bool) -> None:
    """Record the running services for the CLI (the database only if it is the embedded one)."""
    state: dict[str, Any] = {
        "pid": os.getpid(),
        "temporal_address": settings.temporal_address,
        "northwind_url": settings.northwind_url,
    }
    if embedded_database:
        state["database_url"] = settings.database_url
    path = state_path(settings)
    partial = path.with_suffix(".tmp")
    partial.write_text(json.dumps(state, indent=2) + "\n")
    partial.replace(path)


def clear_dev_state(settings: Settings) -> None:
    with contextlib.suppress(FileNotFoundError):
        state_path(settings).unlink()


def read_dev_state(settings: Settings) -> dict[str, Any] | None:
    """The running supervisor's state, or None when no `parley dev` is up in this data folder."""
    try:
        state = json.loads(state_path(settings).read_text())
    except (FileNotFoundError, ValueError):
        return None
    if not isinstance(state, dict) or not _alive(state.get("pid")):
        return None
    return state


def with_dev_services(settings: Settings) -> Settings:
    """`settings`, with whatever the environment left unset taken from a running `parley dev`."""
    state = read_dev_state(settings)
    if state is None:
        return settings
    update = {
        name: state[name]
        for name in _SHARED
        if name not in settings.model_fields_set and isinstance(state.get(name), str)
    }
    return settings.model_copy(update=update) if update else settings


def _alive(pid: object) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def with_demo_backend(settings: Settings) -> list[str]:
    """The deployment's MCP allow-list with the demo backend's host and port added (its MCP
    server is at a loopback address, which nothing but a listed entry reaches)."""
    backend = Origin.of(settings.northwind_url)
    host = f"[{backend.host}]" if ":" in backend.host else backend.host
    entry = f"{host}:{backend.port}"
    listed = settings.mcp_allowed_hosts
    return listed if entry in listed else [*listed, entry]
