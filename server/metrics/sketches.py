"""Downsampled curves: one averaged point per step bucket and trial, aggregated in the database so
only the downsampled curves leave it, and kept (`curve_sketches`) for completed trials, whose points
no longer change, at the width the study page's curves chart asks for by default.

The chart's first call read the best 300 trials' points: at 5,000 trials x 200 evaluations their
58,000 points lay on 26,000 Postgres heap pages, 260 ms of a 300 ms target (docs/dashboard.md,
"Large studies"). The kept rows are the same aggregate (`downsampled`'s very query, run by the curve
statistics keeper as trials complete), one row per trial; a trial with none that holds (running,
retried since, another width) is aggregated from its points as before."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from sqlalchemy import bindparam, text
from sqlalchemy.orm import Session

from hpo.server import db
from hpo.server.models import CurveSketch

POINTS = 60  # points per curve after downsampling: enough for the shape, cheap for 1,000 curves

Curve = tuple[list[int], list[float | None]]

# Integer division buckets the steps on both SQLite and Postgres.
_BUCKETS = """
SELECT trial_id, min(step) AS step, avg(value) AS value
FROM metric_points
WHERE trial_id IN :ids AND name = :name
GROUP BY trial_id, step / :width
"""
_DOWNSAMPLED = _BUCKETS + "ORDER BY trial_id, step"
# On Postgres the buckets of a trial leave the database as two arrays, a row per trial: the
# keeper's pass over 50,000 trials x 20 evaluations fetched a million rows one by one per metric.
_DOWNSAMPLED_ARRAYS = f"""
SELECT trial_id, array_agg(step ORDER BY step) AS steps, array_agg(value ORDER BY step) AS vals
FROM ({_BUCKETS}) b
GROUP BY trial_id
"""

_KEPT = """
SELECT s.trial_id, s.steps, s.means FROM curve_sketches s JOIN trials t ON t.id = s.trial_id
WHERE s.trial_id IN :ids AND s.name = :name AND s.width = :width
  AND s.attempt = t.attempt AND t.status = 'completed'
"""

_MISSING = """
SELECT t.id, t.attempt FROM trials t
WHERE t.study_id = :study_id AND t.status = 'completed'
  AND NOT EXISTS (SELECT 1 FROM curve_sketches s
                  WHERE s.trial_id = t.id AND s.name = :name AND s.attempt = t.attempt AND s.width = :width)
ORDER BY t.id
"""


def bucket_width(horizon: float | None, points: int = POINTS) -> int:
    """The steps one point of a curve stands for, so that `points` points span the horizon."""
    return max(1, math.ceil((horizon or 1.0) / max(points, 2)))


def downsampled(session: Session, trial_ids: Sequence[int], name: str, width: int) -> dict[int, Curve]:
    """`{trial_id: (steps, values)}` of metric `name`, one averaged point per `width` steps (the
    bucket's first step); a bucket with only non-finite values answers None for its value."""
    if not trial_ids:
        return {}
    arrays = db.on_postgres(session)
    statement = text(_DOWNSAMPLED_ARRAYS if arrays else _DOWNSAMPLED).bindparams(bindparam("ids", expanding=True))
    out: dict[int, Curve] = {}
    for chunk in range(0, len(trial_ids), 1000):  # bounded IN lists
        ids = list(trial_ids[chunk : chunk + 1000])
        rows = session.execute(statement, {"ids": ids, "name": name, "width": max(1, int(width))})
        if arrays:
            out.update((r.trial_id, (r.steps, r.vals)) for r in rows)
            continue
        for r in rows:
            steps, values = out.setdefault(r.trial_id, ([], []))
            steps.append(int(r.step))
            values.append(None if r.value is None else float(r.value))
    return out


def curves(session: Session, trial_ids: Sequence[int], name: str, width: int) -> dict[int, Curve]:
    """`downsampled`'s answer, from the kept sketches of the completed trials that have one for
    this width and their current attempt, and from the points for the others."""
    if not trial_ids:
        return {}
    statement = text(_KEPT).bindparams(bindparam("ids", expanding=True))
    out: dict[int, Curve] = {}
    for chunk in range(0, len(trial_ids), 1000):
        ids = list(trial_ids[chunk : chunk + 1000])
        for r in session.execute(statement, {"ids": ids, "name": name, "width": int(width)}):
            out[r.trial_id] = _unpacked(r.steps, r.means)
    rest = [t for t in trial_ids if t not in out]
    return {**out, **downsampled(session, rest, name, width)}


def keep(session: Session, study_id: int, names: Sequence[str], width: int) -> int:
    """Keeps the sketches of `names` at `width` of the study's completed trials that have none that
    holds (a trial with no point of a name gets empty arrays, so it is not aggregated again), in a
    savepoint: a lost race or a read-only database costs only the keeping. Answers how many
    trials it sketched."""
    rows = []
    for name in names:
        missing: dict[int, int] = dict(
            session.execute(text(_MISSING), {"study_id": study_id, "name": name, "width": width}).all()
        )
        if not missing:
            continue
        found = downsampled(session, list(missing), name, width)
        for trial_id, attempt in missing.items():
            steps, values = found.get(trial_id, ([], []))
            packed_steps, packed_means = _packed(steps, values)
            rows.append(
                {
                    "trial_id": trial_id,
                    "name": name,
                    "attempt": attempt,
                    "width": width,
                    "steps": packed_steps,
                    "means": packed_means,
                }
            )
    if not db.keep_rows(session, CurveSketch, rows, f"curve sketches of study {study_id}"):
        return 0
    return len({r["trial_id"] for r in rows})


def _packed(steps: Sequence[int], values: Sequence[float | None]) -> tuple[bytes, bytes]:
    means = np.array([math.nan if v is None else v for v in values], dtype="<f8")
    return np.asarray(steps, dtype="<i8").tobytes(), means.tobytes()


def _unpacked(steps: bytes, means: bytes) -> Curve:
    values = np.frombuffer(means, dtype="<f8")
    return (
        np.frombuffer(steps, dtype="<i8").tolist(),
        [None if math.isnan(v) else v for v in values.tolist()],
    )
