"""worker_health: what each worker last said of its own health (a full or read-only artifact root)

Revision ID: 0015
Revises: 0014
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "worker_health",
        sa.Column("worker_id", sa.String(200), primary_key=True),
        sa.Column("healthy", sa.Boolean(), nullable=False),
        sa.Column("reason", sa.String(2000), nullable=True),
        sa.Column("reported_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("worker_health")
