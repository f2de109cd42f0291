"""bayesian proposal queue: per-study lease and counter, proposal records

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None

_JSON = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql')


def upgrade() -> None:
    op.create_table('bayesian_state',
    sa.Column('study_id', sa.Integer(), nullable=False),
    sa.Column('lease_owner', sa.String(length=64), nullable=True),
    sa.Column('lease_until', sa.Double(), nullable=True),
    sa.Column('next_proposal', sa.Integer(), nullable=False),
    sa.Column('initial_trials', sa.Integer(), nullable=False),
    sa.Column('warm', _JSON, nullable=False),
    sa.Column('model_view', _JSON, nullable=True),
    sa.ForeignKeyConstraint(['study_id'], ['studies.id'], name=op.f('fk_bayesian_state_study_id_studies'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('study_id', name=op.f('pk_bayesian_state'))
    )
    op.create_table('bayesian_proposals',
    sa.Column('trial_id', sa.Integer(), nullable=False),
    sa.Column('study_id', sa.Integer(), nullable=False),
    sa.Column('proposal_index', sa.Integer(), nullable=False),
    sa.Column('seed', sa.BigInteger(), nullable=False),
    sa.Column('model', sa.String(length=32), nullable=False),
    sa.Column('observed_trial_ids', _JSON, nullable=False),
    sa.Column('pending_trial_ids', _JSON, nullable=False),
    sa.Column('warm_observations', sa.Integer(), nullable=False),
    sa.Column('fit_seconds', sa.Double(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
    sa.ForeignKeyConstraint(['study_id'], ['studies.id'], name=op.f('fk_bayesian_proposals_study_id_studies'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['trial_id'], ['trials.id'], name=op.f('fk_bayesian_proposals_trial_id_trials'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('trial_id', name=op.f('pk_bayesian_proposals'))
    )
    with op.batch_alter_table('bayesian_proposals', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_bayesian_proposals_study_id'), ['study_id'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('bayesian_proposals', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_bayesian_proposals_study_id'))
    op.drop_table('bayesian_proposals')
    op.drop_table('bayesian_state')
