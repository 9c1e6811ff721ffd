"""What the deployment files' tests share: the real CLI parser and the real Settings, which
docker-compose.yml and deploy/kubernetes are held to (tests/unit/test_compose.py,
tests/unit/test_kubernetes.py)."""

from __future__ import annotations

import argparse
import contextlib
import io
import shlex

import pytest
from pydantic import AliasChoices

from parley.config import Settings
from parley.launch.cli import build_parser


def parse_parley(argv: list[str], where: str) -> argparse.Namespace:
    """Parse `parley <argv>` with the real CLI parser; an argparse error fails the test."""
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            return build_parser().parse_args(argv)
    except SystemExit:
        pass  # fail below, outside the handler, so the report shows argparse's message only
    pytest.fail(
        f"{where}: `parley {shlex.join(argv)}` is not a command the parley CLI accepts "
        f"(launch/cli.py build_parser). argparse said:\n{stderr.getvalue().strip()}"
    )


def settings_env_names() -> set[str]:
    """Every environment variable name `Settings` reads (upper-cased; it is case-insensitive)."""
    prefix = Settings.model_config.get("env_prefix", "")
    names: set[str] = set()
    for field_name, field in Settings.model_fields.items():
        alias = field.validation_alias or field.alias
        if alias is None:
            names.add(f"{prefix}{field_name}".upper())
        elif isinstance(alias, str):
            names.add(alias.upper())
        elif isinstance(alias, AliasChoices):
            names.update(choice.upper() for choice in alias.choices if isinstance(choice, str))
    return names
