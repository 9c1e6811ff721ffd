"""Apply Alembic migrations from code (used by `parley migrate`, the dev start and tests)."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config

from parley.store.db import sqlalchemy_url

MIGRATIONS = Path(__file__).resolve().parent / "migrations"


def alembic_config(database_url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    # A `%` in a URL would be read as interpolation by ConfigParser.
    config.set_main_option("sqlalchemy.url", sqlalchemy_url(database_url).replace("%", "%%"))
    return config


def upgrade(database_url: str, revision: str = "head") -> None:
    command.upgrade(alembic_config(database_url), revision)
