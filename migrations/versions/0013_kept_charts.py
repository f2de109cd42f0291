"""kept_charts: a study's first-screen charts, kept per study version for a fresh server

One row per study and chart kind (history, axis, isolation, importance): the JSON the chart
endpoint answered, the study version it was computed at and a digest of the code that computed
it (hpo.server.cache.kept). Written only while no trial of the study runs, by the server that
answered the chart or by the keeper once the study is still; a fresh server's first visit of a
large study reads these rows instead of judging every trial again. No foreign key (as
metric_points): nothing deletes studies.

Revision ID: 0013
Revises: 0012
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "kept_charts",
        sa.Column("study_id", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=40), nullable=False),
        sa.Column("version", sa.Text(), nullable=False),
        sa.Column("code", sa.String(length=64), nullable=False),
        sa.Column("body", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("study_id", "kind", name=op.f("pk_kept_charts")),
    )


def downgrade() -> None:
    op.drop_table("kept_charts")
