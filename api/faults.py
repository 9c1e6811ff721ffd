"""Fault injection for crash tests: the API process dies at a named point, as an OOM kill or
an SRE's `kill -9` would, so a test can prove what the outboxes recover. Off unless
`PARLEY_FAULT_KILL_AT` names the point (dev only, parley/config.py).

Points: `answer_committed` — a specialist's answer is committed, not yet signalled.
"""

from __future__ import annotations

import logging
import os
import signal

from parley.config import Settings

log = logging.getLogger(__name__)


def kill_at(settings: Settings, point: str) -> None:
    """SIGKILL this process when `point` is the configured one; otherwise nothing."""
    if settings.fault_kill_at == point:
        log.warning("fault injection: killed at %s", point)
        os.kill(os.getpid(), signal.SIGKILL)
