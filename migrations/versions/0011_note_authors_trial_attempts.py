"""notes.author and trial_attempts: who wrote a note, and each attempt of a trial

`notes.author` is the name of the token that saved the note last (NULL when the server needs no
token, and for notes written before). `trial_attempts` holds one row per claim of a trial: its
worker, start, end and how it ended (hpo.server.trials.leases writes it with each lease transition; the
dashboard's timeline draws one bar per row). Trials that started before this migration have no
rows: the timeline draws them as one bar from their first start to their finish, as before. No
foreign key (as metric_points): nothing deletes trials, and its check would cost every claim.
A plain column and a new table, added and dropped in place (no batch copy on SQLite).

Revision ID: 0011
Revises: 0010
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("notes", sa.Column("author", sa.String(length=200), nullable=True))
    op.create_table(
        "trial_attempts",
        sa.Column("trial_id", sa.Integer(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("worker_id", sa.String(length=200), nullable=True),
        sa.Column("started_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("outcome", sa.String(length=16), nullable=True),
        sa.PrimaryKeyConstraint("trial_id", "attempt", name=op.f("pk_trial_attempts")),
    )


def downgrade() -> None:
    op.drop_table("trial_attempts")
    op.drop_column("notes", "author")
