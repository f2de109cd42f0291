"""metric_chunks: on Postgres, a batch's points of one metric are one row

Postgres paid a heap tuple and a primary-key entry for every metric point (3.2 of its 4.3 us a
point under bench/server_bench.py, the key's index alone 1.6), so ingest stopped near 200,000
points/s on two cores. `metric_chunks` holds one row per trial, metric and batch: the batch's steps
(ascending, unique, disjoint from the other rows of that trial and metric), values (NULL where not
finite) and non-finite flags as arrays. `metric_points` becomes a view that unnests them, with the
same columns as the table it replaces, so every reader's SQL is unchanged; the writers (ingest, a
resumed attempt's history cut) write chunks (hpo.server.metrics.ingest, hpo.server.trials.leases). The rows of
`metric_points` move into one chunk per trial and metric. SQLite keeps its `metric_points` table.

Revision ID: 0014
Revises: 0013
"""

from __future__ import annotations

from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

VIEW = """
CREATE VIEW metric_points AS
SELECT c.trial_id, c.name, p.step, p.value, p.nonfinite
FROM metric_chunks c CROSS JOIN LATERAL unnest(c.steps, c.vals, c.nonfinite) AS p(step, value, nonfinite)
"""


def upgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        return
    op.execute(
        """
        CREATE TABLE metric_chunks (
            trial_id integer NOT NULL,
            name varchar(200) NOT NULL,
            first_step integer NOT NULL,
            last_step integer NOT NULL,
            steps integer[] NOT NULL,
            vals double precision[] NOT NULL,
            nonfinite smallint[] NOT NULL,
            CONSTRAINT pk_metric_chunks PRIMARY KEY (trial_id, name, first_step)
        )
        """
    )
    op.execute(
        """
        INSERT INTO metric_chunks (trial_id, name, first_step, last_step, steps, vals, nonfinite)
        SELECT trial_id, name, min(step), max(step), array_agg(step ORDER BY step),
               array_agg(value ORDER BY step), array_agg(nonfinite ORDER BY step)
        FROM metric_points GROUP BY trial_id, name
        """
    )
    op.execute("DROP TABLE metric_points")
    op.execute(VIEW)


def downgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        return
    op.execute("ALTER VIEW metric_points RENAME TO metric_points_view")
    op.execute(
        """
        CREATE TABLE metric_points (
            trial_id integer NOT NULL,
            name varchar(200) NOT NULL,
            step integer NOT NULL,
            value double precision,
            nonfinite smallint NOT NULL,
            CONSTRAINT pk_metric_points PRIMARY KEY (trial_id, name, step)
        )
        """
    )
    op.execute("INSERT INTO metric_points SELECT trial_id, name, step, value, nonfinite FROM metric_points_view")
    op.execute("DROP VIEW metric_points_view")
    op.execute("DROP TABLE metric_chunks")
