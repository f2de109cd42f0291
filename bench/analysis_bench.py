"""Benchmark of the analysis side on Postgres: a study of 1,000 trials x 200 evaluations x 3 metrics
(600,000 metric points), 5 finished replicas of each arm's best trial, then `analyze_study` (with the
statistics of docs/analysis.md: divergence judged from every completed trial's curves, the overfitting
screen of every finished trial, replica statistics and the Welch comparison) and every plot in SVG
and PNG, each timed warm (the median of several runs after one warm-up) and printed as a table.
Targets: analysis < 1 s at 1,000 trials and < 3 s at 5,000 (3 M points); each plot < 1 s.

    .venv/bin/python bench/analysis_bench.py [--trials 1000] [--evals 200] [--analysis-only] [--url ...]

The study is written straight into a scratch database with set-based SQL (the worker protocol is
benchmarked in bench/server_bench.py); the database is dropped afterwards."""

from __future__ import annotations

import argparse
import json
import statistics
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, text

from hpo.server.analysis.service import analyze_study
from hpo.server.cache import memo
from hpo.server.dashboard import plots
from hpo.server.dashboard.plotdata import PLOT_KINDS, plot_data
from hpo.server.db import Database

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "optimizer-comparison.json"

_TRIALS = """
INSERT INTO trials (study_id, number, arm, params, point_index, seed, replica_index, status, attempt, failures,
                    restart_after_attempt, fail_kind, error, worker_id, started_at, finished_at)
SELECT :study_id, g - 1,
       jsonb_build_object('optimizer', arm),
       jsonb_build_object('optimizer', arm, 'learning_rate', lr, 'weight_decay', wd, 'batch_size', 128,
                          CASE WHEN arm = 'adam' THEN 'beta1' ELSE 'momentum' END, 0.9),
       (g - 1) / 2, g, 0,
       CASE WHEN u > 0.93 THEN 'infeasible' ELSE 'completed' END, 1, 0, 0,
       CASE WHEN u > 0.93 THEN 'infeasible' END,
       CASE WHEN u > 0.93 THEN 'NaN loss at step ' || (100 + g % 500)::text END,
       -- 16 workers, each running its trials back to back, about a minute each (1 in 200 four times that)
       'worker-' || ((g - 1) % 16)::text,
       now() - make_interval(secs => (CAST(:n AS integer) / 16 + 10) * 60 - ((g - 1) / 16) * 60),
       now() - make_interval(secs => (CAST(:n AS integer) / 16 + 10) * 60 - ((g - 1) / 16) * 60
                                     - CASE WHEN g % 200 = 0 THEN 200 ELSE 40 + 15 * v END)
FROM (
    SELECT g, CASE WHEN g % 2 = 0 THEN 'adam' ELSE 'nesterov' END AS arm,
           ((g * 0.6180339887) - floor(g * 0.6180339887)) AS u,
           ((g * 0.7548776662) - floor(g * 0.7548776662)) AS v
    FROM generate_series(1, CAST(:n AS integer)) AS g
) s
CROSS JOIN LATERAL (SELECT exp(ln(1e-4) + u * (ln(1.0) - ln(1e-4))) AS lr,
                           exp(ln(1e-6) + v * (ln(1e-2) - ln(1e-6))) AS wd) p
"""

# Three metrics at every evaluation: a valley in log10(lr) around 1e-2 sets each trial's level.
# Stored as a worker's reporter sends them: one chunk per metric and ten evaluations (the server
# keeps a batch's points of one metric as one row, migration 0014; `metric_points` reads them).
_POINTS = """
INSERT INTO metric_chunks (trial_id, name, first_step, last_step, steps, vals, nonfinite)
SELECT trial_id, name, min(step), max(step), array_agg(step ORDER BY step), array_agg(value ORDER BY step),
       array_agg(nonfinite ORDER BY step)
FROM (
SELECT t.id AS trial_id, m.name, e.step,
       CASE m.name
         WHEN 'valid/error_rate' THEN 0.1 + 0.1 * power(log((t.params->>'learning_rate')::float8) + 2, 2)
                                      + 0.8 * exp(-e.step / 400.0) + 0.004 * (random() - 0.5)
         WHEN 'train/loss' THEN 0.05 + 2.0 * exp(-e.step / 400.0) * (1 + 0.05 * (random() - 0.5))
         ELSE 1.0 + 4.0 * random() * random()
       END AS value,
       CAST(0 AS smallint) AS nonfinite
FROM trials t
CROSS JOIN generate_series(CAST(:every AS integer), CAST(:last AS integer), CAST(:every AS integer)) AS e(step)
CROSS JOIN (VALUES ('valid/error_rate'), ('train/loss'), ('train/grad_norm')) AS m(name)
WHERE t.study_id = :study_id
) p
GROUP BY trial_id, name, (step - CAST(:every AS integer)) / (10 * CAST(:every AS integer))
"""

_BEST = """
UPDATE trials t SET objective_value = b.value, best_step = b.step
FROM (SELECT DISTINCT ON (trial_id) trial_id, value, step FROM metric_points
      WHERE name = 'valid/error_rate' AND nonfinite = 0 ORDER BY trial_id, value, step) b
WHERE b.trial_id = t.id AND t.status = 'completed'
"""


# Five finished replicas of each arm's best trial (their curves are not needed by the analysis).
# Each arm's best in one sorted pass (DISTINCT ON), linear in the trials: the correlated subquery
# it replaces took over 17 minutes at 50,000 trials.
_REPLICAS = """
INSERT INTO trials (study_id, number, arm, params, point_index, seed, replica_of, replica_index, status, attempt,
                    failures, restart_after_attempt, objective_value, best_step)
SELECT b.study_id, 1000000 + 10 * b.rn + r, b.arm, b.params, b.point_index, 2000000000 + 10 * b.rn + r, b.id, r,
       'completed', 1, 0, 0, b.objective_value + 0.003 * (random() - 0.5), b.best_step
FROM (SELECT best.*, row_number() OVER (ORDER BY best.id) AS rn
      FROM (SELECT DISTINCT ON (CAST(t.arm AS TEXT)) t.*
            FROM trials t
            WHERE t.study_id = :study_id AND t.status = 'completed' AND t.objective_value IS NOT NULL
            ORDER BY CAST(t.arm AS TEXT), t.objective_value, t.id) best) b
CROSS JOIN generate_series(1, 5) AS r
"""

# The attempt history the server keeps (trial_attempts, the timeline's bars): each trial's last
# attempt as it ended, and for 1 trial in 10 a first attempt preempted on the next worker before it.
_ATTEMPTS = """
INSERT INTO trial_attempts (trial_id, attempt, worker_id, started_at, ended_at, outcome)
SELECT t.id, CASE WHEN t.number % 10 = 9 THEN 2 ELSE 1 END, t.worker_id, t.started_at, t.finished_at,
       CASE WHEN t.status = 'infeasible' THEN 'infeasible' ELSE 'completed' END
FROM trials t WHERE t.study_id = :study_id AND t.started_at IS NOT NULL
UNION ALL
SELECT t.id, 1, 'worker-' || ((t.number + 1) % 16)::text, t.started_at - interval '50 seconds',
       t.started_at - interval '20 seconds', 'preempted'
FROM trials t WHERE t.study_id = :study_id AND t.started_at IS NOT NULL AND t.number % 10 = 9
"""
_SECOND_ATTEMPTS = """
UPDATE trials SET attempt = 2 WHERE study_id = :study_id AND number % 10 = 9 AND started_at IS NOT NULL
"""


def build_study(db: Database, n_trials: int, evals: int) -> int:
    """Inserts the study, its trials and n_trials x evals x 3 metric points; answers the study id."""
    spec = json.loads(EXAMPLE.read_text())
    spec["trainer"]["max_train_steps"] = 10 * evals
    with db.engine.begin() as conn:
        study_id = conn.execute(
            text(
                "INSERT INTO studies (name, description, goal, status, algorithm, seed, num_trials, next_point_index,"
                " spec, objective_metric, objective_mode, cpus_needed, gpus_needed, max_attempts, max_failed_trials,"
                " consecutive_errors) VALUES (:name, :description, '', 'active', 'halton', 0, :per_arm, :per_arm,"
                " CAST(:spec AS jsonb), 'valid/error_rate', 'min', 1, 0, 3, 3, 0) RETURNING id"
            ),
            {
                "name": spec["name"],
                "description": spec["description"],
                "per_arm": n_trials // 2,
                "spec": json.dumps(spec),
            },
        ).scalar_one()
        conn.execute(text(_TRIALS), {"study_id": study_id, "n": n_trials})
        conn.execute(text(_POINTS), {"study_id": study_id, "every": 10, "last": 10 * evals})
        conn.execute(text(_BEST))
        conn.execute(text(_REPLICAS), {"study_id": study_id})
        conn.execute(text(_ATTEMPTS), {"study_id": study_id})
        conn.execute(text(_SECOND_ATTEMPTS), {"study_id": study_id})
        conn.execute(text("ANALYZE"))
    return int(study_id)


def timed(fn: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    """Median seconds over `repeat` runs after one warm-up run, and the last result."""
    result = fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="postgresql+psycopg://postgres@127.0.0.1:5432", help="Postgres server URL")
    parser.add_argument("--trials", type=int, default=1000)
    parser.add_argument("--evals", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--analysis-only", action="store_true", help="time the analysis, not the plots")
    args = parser.parse_args()
    name = f"hpo_bench_{uuid.uuid4().hex[:8]}"
    admin = create_engine(f"{args.url}/postgres", isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    db = Database(f"{args.url}/{name}")
    try:
        run(db, args)
    finally:
        db.dispose()
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def run(db: Database, args: argparse.Namespace) -> None:
    db.upgrade()
    start = time.perf_counter()
    study_id = build_study(db, args.trials, args.evals)
    with db.engine.connect() as conn:
        points = conn.execute(text("SELECT count(*) FROM metric_points")).scalar_one()
    print(f"built {args.trials} trials, {points:,} metric points in {time.perf_counter() - start:.1f} s")
    rows = []
    # The first call aggregates every curve (and keeps the statistics in curve_stats); a fresh
    # server process then reads the kept statistics (memo cleared); the warm median below reuses
    # the process' memo of the study's judged trials.
    for what in ("analysis, first call (nothing kept)", "analysis, new process (curve_stats kept)"):
        memo.clear()
        start = time.perf_counter()
        analyze_study(db, study_id)
        rows.append((what, time.perf_counter() - start, ""))
    seconds, analysis = timed(lambda: analyze_study(db, study_id), args.repeat)
    cmp = analysis["comparison"] or {}
    note = f"{len(analysis['warnings'])} warnings, verdict {cmp.get('verdict')}, "
    note += f"{analysis['overfitting']['examined']} trials screened, {len(analysis['infeasible']['diverged'])} diverged"
    rows.append(("analysis (GET .../analysis)", seconds, note))
    for kind in () if args.analysis_only else PLOT_KINDS:
        for fmt in ("svg", "png"):
            seconds, body = timed(lambda k=kind, f=fmt: plots.render(k, plot_data(db, study_id, k), f), args.repeat)
            rows.append((f"plot {kind}.{fmt}", seconds, f"{len(body) / 1024:.0f} KiB"))
    print(f"{'what':34} {'median s':>9}  target  note")
    for what, seconds, note in rows:
        target = 3.0 if what.startswith("analysis") and args.trials > 1000 else 1.0
        verdict = "ok" if seconds < target else "SLOW"
        print(f"{what:34} {seconds:9.3f}  <{target:.0f} s {verdict:4}  {note}")


if __name__ == "__main__":
    main()
