"""trials.unread_params: hyperparameters the trial's script never read (hpo.session) or was never passed

Reported by the worker when an attempt ends (docs/worker-protocol.md, "5. End the attempt"): a name
the script never reads trains every trial at the script's default, silently. NULL when nothing is
known (a script that reads $HPO_CONFIG by itself); an empty list when every hyperparameter reached
the script. A plain column, added and dropped in place, as 0008.

Revision ID: 0010
Revises: 0009
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("trials", sa.Column("unread_params", sa.JSON().with_variant(JSONB(), "postgresql"), nullable=True))


def downgrade() -> None:
    op.drop_column("trials", "unread_params")
