"""trials.retry_of: a retried failed trial's new run names the trial it retries

A plain column without a foreign key, added and dropped in place (no batch copy of `trials` on
SQLite), as `studies.round_id` in 0007.

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0008'
down_revision = '0007'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('trials', sa.Column('retry_of', sa.Integer(), nullable=True))


def downgrade() -> None:
    op.drop_column('trials', 'retry_of')
