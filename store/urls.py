"""The database's two URLs, both from the one `DATABASE_URL`: SQLAlchemy's engine (the pool,
and alembic's for migrations) wants `postgresql+psycopg://…`, psycopg's own connections (the
LISTEN ones) a plain libpq URL."""

from __future__ import annotations


def sqlalchemy_url(url: str) -> str:
    for prefix in ("postgresql+psycopg://", "postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    raise ValueError("DATABASE_URL must be a postgresql:// URL")


def libpq_url(url: str) -> str:
    return "postgresql://" + sqlalchemy_url(url).removeprefix("postgresql+psycopg://")
