"""dashboard sessions kept server-side; the signing key leaves the database; trials count their points

Sessions: the cookie holds a random id whose SHA-256 is a row here, deleted at sign-out, so a
signed-out cookie stops working on every server at once (it was a signed cookie valid for 12 h).
The signing key moves to HPO_SESSION_SECRET or a key file (hpo.server.auth.signing_key): the old row
held a usable key beside the token hashes and is dropped with its table, so sessions signed in and
trial tokens issued before this upgrade stop working: people sign in again, and running trials'
reports are refused (401) and dropped by their workers, so let them finish (or stop the workers)
before upgrading. `trials.point_count` backs the per-trial metric quota; NULL on
existing trials, counted at their next write.

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('dashboard_sessions',
    sa.Column('id_hash', sa.String(length=64), nullable=False),
    sa.Column('token_hash', sa.String(length=64), nullable=False),
    sa.Column('expires_at', sa.Double(), nullable=False),
    sa.PrimaryKeyConstraint('id_hash', name=op.f('pk_dashboard_sessions'))
    )
    op.create_index(op.f('ix_dashboard_sessions_token_hash'), 'dashboard_sessions', ['token_hash'], unique=False)
    op.drop_table('server_secrets')
    with op.batch_alter_table('trials', schema=None) as batch_op:
        batch_op.add_column(sa.Column('point_count', sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('trials', schema=None) as batch_op:
        batch_op.drop_column('point_count')
    # Recreated empty: a key is never written back into the database.
    op.create_table('server_secrets',
    sa.Column('name', sa.String(length=64), nullable=False),
    sa.Column('value', sa.String(length=200), nullable=False),
    sa.PrimaryKeyConstraint('name', name=op.f('pk_server_secrets'))
    )
    op.drop_index(op.f('ix_dashboard_sessions_token_hash'), table_name='dashboard_sessions')
    op.drop_table('dashboard_sessions')
