"""pipelines, rounds, launches and round recipes; studies name their round (docs/rounds.md)

`studies.round_id` has no foreign key: SQLite could add one only by batch mode's copy of the
table, and dropping the old `studies` table with foreign keys on would cascade into every trial.
Both columns are added in place (ALTER TABLE ADD COLUMN) and dropped in place (SQLite 3.35+).

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = '0007'
down_revision = '0006'
branch_labels = None
depends_on = None

_JSON = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql')


def upgrade() -> None:
    op.create_table('pipelines',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=200), nullable=False),
    sa.Column('description', sa.Text(), nullable=False),
    sa.Column('objective_metric', sa.String(length=200), nullable=False),
    sa.Column('objective_mode', sa.String(length=3), nullable=False),
    sa.Column('trainer', _JSON, nullable=False),
    sa.Column('baseline_params', _JSON, nullable=False),
    sa.Column('baseline_trial_id', sa.Integer(), nullable=True),
    sa.Column('baseline_round_id', sa.Integer(), nullable=True),
    sa.Column('baseline_objective', _JSON, nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_pipelines')),
    sa.UniqueConstraint('name', name=op.f('uq_pipelines_name'))
    )
    op.create_table('rounds',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('pipeline_id', sa.Integer(), nullable=False),
    sa.Column('number', sa.Integer(), nullable=False),
    sa.Column('goal', sa.Text(), nullable=False),
    sa.Column('kind', sa.String(length=16), nullable=False),
    sa.Column('decision', _JSON, nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
    sa.ForeignKeyConstraint(['pipeline_id'], ['pipelines.id'], name=op.f('fk_rounds_pipeline_id_pipelines'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_rounds')),
    sa.UniqueConstraint('pipeline_id', 'number', name=op.f('uq_rounds_pipeline_id_number'))
    )
    op.create_index(op.f('ix_rounds_pipeline_id'), 'rounds', ['pipeline_id'], unique=False)
    op.create_table('round_recipes',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('round_id', sa.Integer(), nullable=False),
    sa.Column('kind', sa.String(length=16), nullable=False),
    sa.Column('study_id', sa.Integer(), nullable=False),
    sa.Column('options', _JSON, nullable=False),
    sa.Column('readout', _JSON, nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
    sa.ForeignKeyConstraint(['round_id'], ['rounds.id'], name=op.f('fk_round_recipes_round_id_rounds'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['study_id'], ['studies.id'], name=op.f('fk_round_recipes_study_id_studies'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_round_recipes'))
    )
    op.create_index(op.f('ix_round_recipes_round_id'), 'round_recipes', ['round_id'], unique=False)
    op.create_table('launches',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('pipeline_id', sa.Integer(), nullable=False),
    sa.Column('round_id', sa.Integer(), nullable=False),
    sa.Column('trial_id', sa.Integer(), nullable=True),
    sa.Column('params_before', _JSON, nullable=False),
    sa.Column('params_after', _JSON, nullable=False),
    sa.Column('objective_before', _JSON, nullable=True),
    sa.Column('objective_after', _JSON, nullable=True),
    sa.Column('evidence', _JSON, nullable=False),
    sa.Column('note', sa.Text(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
    sa.ForeignKeyConstraint(['pipeline_id'], ['pipelines.id'], name=op.f('fk_launches_pipeline_id_pipelines'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['round_id'], ['rounds.id'], name=op.f('fk_launches_round_id_rounds'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['trial_id'], ['trials.id'], name=op.f('fk_launches_trial_id_trials'), ondelete='SET NULL'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_launches'))
    )
    op.create_index(op.f('ix_launches_pipeline_id'), 'launches', ['pipeline_id'], unique=False)
    op.add_column('studies', sa.Column('round_id', sa.Integer(), nullable=True))
    op.add_column('studies', sa.Column('round_role', sa.String(length=16), nullable=True))
    op.create_index(op.f('ix_studies_round_id'), 'studies', ['round_id'], unique=False)


def downgrade() -> None:
    op.drop_index(op.f('ix_studies_round_id'), table_name='studies')
    op.drop_column('studies', 'round_role')
    op.drop_column('studies', 'round_id')
    op.drop_index(op.f('ix_launches_pipeline_id'), table_name='launches')
    op.drop_table('launches')
    op.drop_index(op.f('ix_round_recipes_round_id'), table_name='round_recipes')
    op.drop_table('round_recipes')
    op.drop_index(op.f('ix_rounds_pipeline_id'), table_name='rounds')
    op.drop_table('rounds')
    op.drop_table('pipelines')
