"""The SQL that loads what the analysis needs. The heavy lifting stays in the database: per-trial
best values and steps are columns the server keeps, the best few trials of each arm are ranked by a
window function, gradient-norm percentiles come from ranked rows, and only the curves of those few
trials ever leave the database (never the whole study's metric points).

Every function takes an open session (one transaction, so one consistent snapshot) and answers
plain values (see `model.py`). Queries are portable between SQLite and Postgres."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from sqlalchemy import bindparam, select, text
from sqlalchemy.orm import Session

from ..errors import NotFound
from ..models import NonFinite, Study, Trial
from .model import Curve, TrialSummary


@dataclass(frozen=True)
class StudyInfo:
    id: int
    name: str
    description: str
    status: str
    spec: dict[str, Any]
    metric: str
    mode: str


def study_info(session: Session, study_id: int) -> StudyInfo:
    """The study's identity, stored spec and objective; `NotFound` for an unknown id."""
    study = session.get(Study, study_id)
    if study is None:
        raise NotFound(f"study {study_id} not found")
    return StudyInfo(
        id=study.id,
        name=study.name,
        description=study.description,
        status=study.status.value,
        spec=dict(study.spec or {}),
        metric=study.objective_metric,
        mode=study.objective_mode,
    )


def trial_summaries(session: Session, study_id: int) -> list[TrialSummary]:
    """Every trial of the study, by number, with its stored best value and step."""
    rows = session.execute(
        select(
            Trial.id,
            Trial.number,
            Trial.arm,
            Trial.params,
            Trial.status,
            Trial.objective_value,
            Trial.best_step,
            Trial.replica_of,
            Trial.fail_kind,
            Trial.error,
        )
        .where(Trial.study_id == study_id)
        .order_by(Trial.number)
    ).all()
    return [
        TrialSummary(
            id=r.id,
            number=r.number,
            arm=r.arm or {},
            params=r.params or {},
            status=r.status.value,
            objective=r.objective_value,
            best_step=r.best_step,
            replica_of=r.replica_of,
            fail_kind=r.fail_kind,
            error=r.error,
        )
        for r in rows
    ]


# The best `k` completed original trials of each arm (row_number over the arm), with the curves
# asked for. ORDER BY direction comes from a fixed pair of strings, never from input.
_BEST_CURVES = """
WITH ranked AS (
    SELECT id, number, row_number() OVER (PARTITION BY CAST(arm AS TEXT) ORDER BY objective_value {direction}, number)
           AS arm_rank
    FROM trials
    WHERE study_id = :study_id AND replica_of IS NULL AND status = 'completed' AND objective_value IS NOT NULL
)
SELECT r.id AS trial_id, r.arm_rank, m.name, m.step, m.value, m.nonfinite
FROM ranked r LEFT JOIN metric_points m ON m.trial_id = r.id AND m.name IN :names
WHERE r.arm_rank <= :k
ORDER BY r.id, m.name, m.step
"""


def best_trial_curves(
    session: Session, study_id: int, mode: str, k: int, names: Sequence[str]
) -> tuple[dict[int, int], dict[int, dict[str, Curve]]]:
    """The best `k` trials of every arm, `{trial_id: rank in its arm}`, and their `names` curves."""
    statement = text(_BEST_CURVES.format(direction="ASC" if mode == "min" else "DESC")).bindparams(
        bindparam("names", expanding=True)
    )
    rows = session.execute(statement, {"study_id": study_id, "k": k, "names": list(names)}).all()
    ranks = {r.trial_id: int(r.arm_rank) for r in rows}
    return ranks, _curves(r for r in rows if r.name is not None)


def curves_of(
    session: Session, trial_ids: Sequence[int], names: Sequence[str] | None = None
) -> dict[int, dict[str, Curve]]:
    """The curves of the given trials (every metric, or only `names`), in step order."""
    if not trial_ids:
        return {}
    where = "trial_id IN :ids" + (" AND name IN :names" if names else "")
    statement = text(
        f"SELECT trial_id, name, step, value, nonfinite FROM metric_points WHERE {where} ORDER BY trial_id, name, step"
    ).bindparams(bindparam("ids", expanding=True), *([bindparam("names", expanding=True)] if names else []))
    params: dict[str, Any] = {"ids": list(trial_ids)}
    if names:
        params["names"] = list(names)
    return _curves(session.execute(statement, params))


# Nearest ranks around the 90th percentile of each trial's finite values: numpy's default
# (linear) percentile is then one interpolation between two rows, identical on both databases.
_P90 = """
WITH g AS (
    SELECT trial_id, value,
           row_number() OVER (PARTITION BY trial_id ORDER BY value) AS rn,
           count(*) OVER (PARTITION BY trial_id) AS n
    FROM metric_points
    WHERE trial_id IN :ids AND name = :metric AND nonfinite = 0
)
SELECT trial_id, n, rn, value FROM g
WHERE rn = (9 * (n - 1)) / 10 + 1 OR rn = (9 * (n - 1)) / 10 + 2
ORDER BY trial_id, rn
"""

_MEAN = """
SELECT trial_id, avg(value) AS mean, count(*) AS n FROM metric_points
WHERE trial_id IN :ids AND name = :metric AND nonfinite = 0
GROUP BY trial_id
"""


def grad_norm_stats(
    session: Session, trial_ids: Sequence[int], metric: str = "train/grad_norm", clipped: str = "train/clipped_fraction"
) -> list[dict[str, Any]]:
    """Per trial: `{trial_id, p90, n}` of the unclipped gradient norm and the mean
    `clipped_fraction` (None when the trainer did not report it)."""
    if not trial_ids:
        return []
    rows = session.execute(
        text(_P90).bindparams(bindparam("ids", expanding=True)), {"ids": list(trial_ids), "metric": metric}
    ).all()
    means = session.execute(
        text(_MEAN).bindparams(bindparam("ids", expanding=True)), {"ids": list(trial_ids), "metric": clipped}
    ).all()
    clipped_by = {r.trial_id: float(r.mean) for r in means}
    out: list[dict[str, Any]] = []
    for trial_id in trial_ids:
        mine = [r for r in rows if r.trial_id == trial_id]
        if mine:
            n = int(mine[0].n)
            h = 0.9 * (n - 1)
            lo = float(mine[0].value)
            hi = float(mine[-1].value)
            out.append({"trial_id": trial_id, "n": n, "p90": lo + (h - int(h)) * (hi - lo)})
        else:
            out.append({"trial_id": trial_id, "n": 0, "p90": None})
        out[-1]["clipped_fraction"] = clipped_by.get(trial_id)
    return out


def last_step(session: Session, study_id: int, metric: str) -> int | None:
    """The largest step any trial of the study reported for `metric` (the horizon when the spec
    has no max_train_steps)."""
    value = session.execute(
        text(
            "SELECT max(m.step) FROM metric_points m JOIN trials t ON t.id = m.trial_id "
            "WHERE t.study_id = :study_id AND m.name = :metric"
        ),
        {"study_id": study_id, "metric": metric},
    ).scalar()
    return None if value is None else int(value)


def _curves(rows: Iterable[Any]) -> dict[int, dict[str, Curve]]:
    grouped: dict[int, dict[str, tuple[list[int], list[float]]]] = {}
    for r in rows:
        steps, values = grouped.setdefault(r.trial_id, {}).setdefault(r.name, ([], []))
        steps.append(r.step)
        values.append(np.nan if r.nonfinite != NonFinite.finite or r.value is None else r.value)
    return {
        tid: {name: Curve(np.asarray(s, dtype=float), np.asarray(v, dtype=float)) for name, (s, v) in by_name.items()}
        for tid, by_name in grouped.items()
    }
