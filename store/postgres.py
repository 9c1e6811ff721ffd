"""How Parley reaches PostgreSQL: the URLs, both from the one `DATABASE_URL` (SQLAlchemy's
engine, the pool and alembic's, wants `postgresql+psycopg://…`; psycopg's own connections,
the LISTEN ones, a plain libpq URL), and the options of every pooled connection."""

from __future__ import annotations

from typing import Any

# psycopg prepares a statement at its second run on a connection (its default: the sixth):
# planning the hot path's larger statements costs PostgreSQL more than running them. The pool
# hands out the connection given back last (store/db.py), so after a burst the next turns run
# on a few connections, where their statements are prepared, not in turn on each one the
# burst opened. Then the connections at the bottom of the pool may sit idle for long: TCP
# keepalives after a minute of silence find one a network cut dropped without a word (its
# socket errors, and the pool's check at checkout throws it away) before a statement waits on
# it. What a `DATABASE_URL` sets itself (its own keepalives, say) is kept.
CONNECTION_OPTIONS: dict[str, Any] = {
    "prepare_threshold": 1,
    "keepalives": 1,
    "keepalives_idle": 60,
    "keepalives_interval": 10,
    "keepalives_count": 3,
}


def sqlalchemy_url(url: str) -> str:
    for prefix in ("postgresql+psycopg://", "postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    raise ValueError("DATABASE_URL must be a postgresql:// URL")


def libpq_url(url: str) -> str:
    return "postgresql://" + sqlalchemy_url(url).removeprefix("postgresql+psycopg://")
