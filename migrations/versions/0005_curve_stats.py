"""kept per-trial curve statistics of completed trials (the analysis' divergence and curve checks)

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('curve_stats',
    sa.Column('trial_id', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=200), nullable=False),
    sa.Column('attempt', sa.Integer(), nullable=False),
    sa.Column('cut', sa.Integer(), nullable=False),
    sa.Column('first_step', sa.Integer(), nullable=False),
    sa.Column('first_obj', sa.Integer(), nullable=False),
    sa.Column('n', sa.Integer(), nullable=False),
    sa.Column('v0', sa.Double(), nullable=True),
    sa.Column('vmin', sa.Double(), nullable=True),
    sa.Column('vmax', sa.Double(), nullable=True),
    sa.Column('late_n', sa.Integer(), nullable=True),
    sa.Column('late_min', sa.Double(), nullable=True),
    sa.Column('late_max', sa.Double(), nullable=True),
    sa.Column('sx', sa.Double(), nullable=True),
    sa.Column('sy', sa.Double(), nullable=True),
    sa.Column('sxx', sa.Double(), nullable=True),
    sa.Column('sxy', sa.Double(), nullable=True),
    sa.Column('syy', sa.Double(), nullable=True),
    sa.Column('s1', sa.Integer(), nullable=True),
    sa.PrimaryKeyConstraint('trial_id', 'name', name=op.f('pk_curve_stats'))
    )


def downgrade() -> None:
    op.drop_table('curve_stats')
