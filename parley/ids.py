"""Prefixed random ids (`ses_…`, `trn_…`) and the ids derived from them.

Derived ids are pure functions so that the API, the workflow and the activities agree on
them without passing anything extra through workflow history.
"""

from __future__ import annotations

import secrets


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(10)}"


def workflow_id_for_turn(turn_id: str) -> str:
    return f"turn-{turn_id}"
