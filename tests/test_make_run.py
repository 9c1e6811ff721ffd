"""`make run` as a user meets it: the printed curl example streams a reply; Ctrl-C stops all.

Runs `parley dev` (what `make run` runs after installing) on free ports with its own data
folder, exactly as a user would, then executes the banner's curl line in a shell.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil

from tests.conftest import REPO, free_port


def port_is_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_dev_start_prints_urls_and_a_token_and_its_curl_streams_a_reply(tmp_path: Path) -> None:
    api_port, temporal_port, ui_port = free_port(), free_port(), free_port()
    backend_port, metrics_port = free_port(), free_port()
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("DATABASE_URL", "TEMPORAL_ADDRESS", "PARLEY_NORTHWIND_URL")
    }
    env.update(
        PARLEY_DATA_DIR=str(tmp_path / "data"),
        PARLEY_API_PORT=str(api_port),
        PARLEY_DEV_TEMPORAL_PORT=str(temporal_port),
        PARLEY_TEMPORAL_UI_PORT=str(ui_port),
        PARLEY_NORTHWIND_PORT=str(backend_port),
        PARLEY_WORKER_METRICS_PORT=str(metrics_port),
    )
    dev = subprocess.Popen(
        [sys.executable, "-m", "launch.cli", "dev"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    banner: list[str] = []
    try:
        assert dev.stdout is not None
        deadline = time.monotonic() + 120
        for line in dev.stdout:
            banner.append(line.rstrip("\n"))
            if line.strip().startswith("curl -sN"):
                break
            assert time.monotonic() < deadline, "\n".join(banner)
        text = "\n".join(banner)
        assert f"http://127.0.0.1:{api_port}/" in text
        assert f"http://127.0.0.1:{ui_port}/" in text
        assert "Token for Priya" in text
        assert port_is_open(ui_port), "the Temporal Web UI is not listening"
        assert f"http://127.0.0.1:{backend_port}/" in text
        assert port_is_open(metrics_port), "the worker's metrics port is not listening"

        curl = banner[-1].strip()
        result = subprocess.run(
            ["bash", "-c", curl], capture_output=True, text=True, timeout=60, env=env
        )
        assert result.returncode == 0, result.stderr
        assert "event: delta" in result.stdout
        assert "event: done" in result.stdout
        assert "8472" in result.stdout
    finally:
        dev.send_signal(signal.SIGINT)  # what Ctrl-C sends
        try:
            dev.wait(60)
        finally:
            if dev.poll() is None:
                os.killpg(dev.pid, signal.SIGKILL)
    assert dev.returncode == 0
    for port in (api_port, temporal_port, ui_port, backend_port, metrics_port):
        assert not port_is_open(port), f"port {port} still open after Ctrl-C"
    data_dir = str(tmp_path / "data")
    leftovers = [
        p.info["name"]
        for p in psutil.process_iter(["name", "cmdline"])
        if any(data_dir in part for part in p.info["cmdline"] or ())
    ]
    assert leftovers == [], "processes left running after Ctrl-C"
