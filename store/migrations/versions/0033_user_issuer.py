"""users.issuer: the identity provider that made a user on first sight (NULL: a user Parley
made, seeded or by the CLI), so a provider's token never names a user it did not make

Revision ID: 0033
Revises: 0031
Create Date: 2026-12-06 15:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0033"
down_revision = "0031"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("users", sa.Column("issuer", sa.String(300), nullable=True))


def downgrade() -> None:
    op.drop_column("users", "issuer")
