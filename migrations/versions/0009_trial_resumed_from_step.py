"""trials.resumed_from_step: the earliest checkpoint step the trial's current history was resumed from

NULL when its history (since its last start from scratch) comes from one uninterrupted attempt. A
trial whose best step lies beyond it reached its best value in a resumed attempt (`resumed`).
A plain column, added and dropped in place (no batch copy of `trials` on SQLite), as 0008.

Revision ID: 0009
Revises: 0008
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("trials", sa.Column("resumed_from_step", sa.Integer(), nullable=True))


def downgrade() -> None:
    op.drop_column("trials", "resumed_from_step")
