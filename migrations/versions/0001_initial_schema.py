"""initial schema

Revision ID: 0001
Revises: 
Create Date: 2026-11-22 13:34:30.393967
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = '0001'
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('studies',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=200), nullable=False),
    sa.Column('description', sa.Text(), nullable=False),
    sa.Column('goal', sa.Text(), nullable=False),
    sa.Column('status', sa.Enum('active', 'paused', 'archived', name='studystatus', native_enum=False, length=16), nullable=False),
    sa.Column('algorithm', sa.String(length=16), nullable=False),
    sa.Column('seed', sa.BigInteger(), nullable=False),
    sa.Column('num_trials', sa.Integer(), nullable=False),
    sa.Column('next_point_index', sa.Integer(), nullable=False),
    sa.Column('spec', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=False),
    sa.Column('objective_metric', sa.String(length=200), nullable=False),
    sa.Column('objective_mode', sa.String(length=3), nullable=False),
    sa.Column('cpus_needed', sa.Double(), nullable=False),
    sa.Column('gpus_needed', sa.Double(), nullable=False),
    sa.Column('max_attempts', sa.Integer(), nullable=False),
    sa.Column('max_failed_trials', sa.Integer(), nullable=False),
    sa.Column('consecutive_errors', sa.Integer(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_studies')),
    sa.UniqueConstraint('name', name=op.f('uq_studies_name'))
    )
    op.create_table('trials',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('study_id', sa.Integer(), nullable=False),
    sa.Column('number', sa.Integer(), nullable=False),
    sa.Column('arm', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=False),
    sa.Column('params', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=False),
    sa.Column('point_index', sa.Integer(), nullable=True),
    sa.Column('unit_point', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=True),
    sa.Column('seed', sa.BigInteger(), nullable=False),
    sa.Column('replica_of', sa.Integer(), nullable=True),
    sa.Column('replica_index', sa.Integer(), nullable=False),
    sa.Column('status', sa.Enum('pending', 'running', 'completed', 'infeasible', 'failed', 'cancelled', name='trialstatus', native_enum=False, length=16), nullable=False),
    sa.Column('attempt', sa.Integer(), nullable=False),
    sa.Column('failures', sa.Integer(), nullable=False),
    sa.Column('restart_after_attempt', sa.Integer(), nullable=False),
    sa.Column('lease_id', sa.String(length=36), nullable=True),
    sa.Column('lease_expires_at', sa.Double(), nullable=True),
    sa.Column('worker_id', sa.String(length=200), nullable=True),
    sa.Column('objective_value', sa.Double(), nullable=True),
    sa.Column('best_step', sa.Integer(), nullable=True),
    sa.Column('fail_kind', sa.String(length=16), nullable=True),
    sa.Column('error', sa.Text(), nullable=True),
    sa.Column('error_step', sa.Integer(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
    sa.Column('started_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['replica_of'], ['trials.id'], name=op.f('fk_trials_replica_of_trials'), ondelete='SET NULL'),
    sa.ForeignKeyConstraint(['study_id'], ['studies.id'], name=op.f('fk_trials_study_id_studies'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_trials')),
    sa.UniqueConstraint('study_id', 'number', name=op.f('uq_trials_study_id_number'))
    )
    with op.batch_alter_table('trials', schema=None) as batch_op:
        batch_op.create_index('ix_trials_pending_id', ['id'], unique=False,
                              postgresql_where=sa.text("status = 'pending'"), sqlite_where=sa.text("status = 'pending'"))
        batch_op.create_index('ix_trials_running_lease', ['lease_expires_at'], unique=False,
                              postgresql_where=sa.text("status = 'running'"), sqlite_where=sa.text("status = 'running'"))
        batch_op.create_index(batch_op.f('ix_trials_study_id'), ['study_id'], unique=False)

    op.create_table('checkpoints',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('trial_id', sa.Integer(), nullable=False),
    sa.Column('attempt', sa.Integer(), nullable=False),
    sa.Column('step', sa.Integer(), nullable=False),
    sa.Column('uri', sa.Text(), nullable=False),
    sa.Column('objective', sa.Double(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
    sa.ForeignKeyConstraint(['trial_id'], ['trials.id'], name=op.f('fk_checkpoints_trial_id_trials'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_checkpoints')),
    sa.UniqueConstraint('trial_id', 'attempt', 'step', name=op.f('uq_checkpoints_trial_id_attempt_step'))
    )
    with op.batch_alter_table('checkpoints', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_checkpoints_trial_id'), ['trial_id'], unique=False)

    op.create_table('metric_points',
    sa.Column('trial_id', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=200), nullable=False),
    sa.Column('step', sa.Integer(), nullable=False),
    sa.Column('value', sa.Double(), nullable=True),
    sa.Column('nonfinite', sa.SmallInteger(), nullable=False),
    sa.PrimaryKeyConstraint('trial_id', 'name', 'step', name=op.f('pk_metric_points'))
    )


def downgrade() -> None:
    op.drop_table('metric_points')
    with op.batch_alter_table('checkpoints', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_checkpoints_trial_id'))

    op.drop_table('checkpoints')
    with op.batch_alter_table('trials', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_trials_study_id'))
        batch_op.drop_index('ix_trials_running_lease')
        batch_op.drop_index('ix_trials_pending_id')

    op.drop_table('trials')
    op.drop_table('studies')
