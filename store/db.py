"""Engines and connection strings.

SQLAlchemy wants `postgresql+psycopg://…`; psycopg's own LISTEN connection wants a plain
libpq URL. Both are derived from the one `DATABASE_URL`.
"""

from __future__ import annotations

from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)


def sqlalchemy_url(url: str) -> str:
    for prefix in ("postgresql+psycopg://", "postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    raise ValueError("DATABASE_URL must be a postgresql:// URL")


def libpq_url(url: str) -> str:
    return "postgresql://" + sqlalchemy_url(url).removeprefix("postgresql+psycopg://")


def create_engine(url: str, *, pool_size: int = 10, max_overflow: int = 20) -> AsyncEngine:
    return create_async_engine(
        sqlalchemy_url(url),
        pool_size=pool_size,
        max_overflow=max_overflow,
        pool_pre_ping=True,
        # Errors must not carry statement parameters (message text, addresses) into logs or
        # into Temporal history as activity failures.
        hide_parameters=True,
    )


def session_factory(engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    return async_sessionmaker(engine, expire_on_commit=False)
