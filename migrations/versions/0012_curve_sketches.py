"""curve_sketches: each completed trial's downsampled curves, kept for the curves chart

One row per completed trial and metric, written by the curve statistics keeper (hpo.server.
analysis.sketches): the bucket width it was downsampled with and the points as packed arrays. The
study page's curves chart reads these rows for its best trials instead of every metric point of
them. Trials completed before this migration get theirs on the keeper's next pass. No foreign key
(as metric_points): nothing deletes trials.

Revision ID: 0012
Revises: 0011
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "curve_sketches",
        sa.Column("trial_id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("width", sa.Integer(), nullable=False),
        sa.Column("steps", sa.LargeBinary(), nullable=False),
        sa.Column("means", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("trial_id", "name", name=op.f("pk_curve_sketches")),
    )


def downgrade() -> None:
    op.drop_table("curve_sketches")
