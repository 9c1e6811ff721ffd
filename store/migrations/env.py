"""Alembic environment: runs migrations over a synchronous psycopg connection."""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine, pool

from parley.store import locks
from parley.store.models import Base

config = context.config
target_metadata = Base.metadata


def run_migrations_online() -> None:
    engine = create_engine(config.get_main_option("sqlalchemy.url") or "", poolclass=pool.NullPool)
    with engine.connect() as connection:
        context.configure(connection=connection, target_metadata=target_metadata)
        with context.begin_transaction():
            # Held to the end of the upgrade's transaction: a second `parley migrate` (another
            # pod starting) waits here, then reads the version this one committed.
            connection.exec_driver_sql(locks.HOLD_SQL, {"lock_key": locks.SCHEMA_MIGRATIONS})
            context.run_migrations()
    engine.dispose()


run_migrations_online()
