"""notes on studies and trials (the dashboard's notes)

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('notes',
    sa.Column('study_id', sa.Integer(), nullable=False),
    sa.Column('trial_id', sa.Integer(), nullable=False),
    sa.Column('body', sa.Text(), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
    sa.ForeignKeyConstraint(['study_id'], ['studies.id'], name=op.f('fk_notes_study_id_studies'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('study_id', 'trial_id', name=op.f('pk_notes'))
    )


def downgrade() -> None:
    op.drop_table('notes')
