"""The SQL that loads what the analysis needs. The heavy lifting stays in the database: per-trial
best values and steps are columns the server keeps, the best few trials of each arm are ranked by a
window function, gradient-norm percentiles come from ranked rows, and only the curves of those few
trials ever leave the database (never the whole study's metric points).

Every function takes an open session (one transaction, so one consistent snapshot) and answers
plain values (see `model.py`). Queries are portable between SQLite and Postgres."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import cached_property
from typing import Any, TypeVar

import msgspec
import numpy as np
from sqlalchemy import String, bindparam, cast, select, text
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from hpo.server.analysis.model import Curve, StudyInfo, TrialSummary, arm_key, collector_paused
from hpo.server.db import close_quietly, discard, keep_rows, on_postgres
from hpo.server.errors import NotFound
from hpo.server.models import FINISHED_STATUSES, CurveStat, Study, Trial, TrialStatus
from hpo.server.numbers import NonFinite

_log = logging.getLogger("hpo.server.analysis")
_T = TypeVar("_T")
_BESIDE = ThreadPoolExecutor(max_workers=4, thread_name_prefix="hpo-read-beside")


def beside(session: Session, read: Callable[[Session], _T]) -> Future[_T]:
    """`read` on a second session of the same Postgres database, in a thread, while the caller
    goes on with its own session: the two queries run side by side in the database, and the one
    that is Python work (building summaries) runs while the other waits on Postgres. As with two
    statements of one READ COMMITTED transaction, each sees the data as of when it ran. The read
    must not write. On SQLite (one writer, and its reads are fast) `read` runs now, on `session`."""
    bind = session.get_bind()
    done: Future[_T] = Future()
    if bind.dialect.name != "postgresql":
        try:
            done.set_result(read(session))
        except BaseException as exc:  # noqa: BLE001 -- handed to whoever asks for the result
            done.set_exception(exc)
        return done

    def run() -> _T:
        # The rollback and close are guarded as in `Database.transaction()`: on a connection that
        # died mid-read they fail too, and must not replace the read's own error.
        other = Session(bind)
        try:
            return read(other)
        finally:
            discard(other)
            close_quietly(other)

    return _BESIDE.submit(run)


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


def arms_of(session: Session, study_id: int) -> list[dict[str, Any]]:
    """The distinct arms the study's trials belong to (one small query: the study page asks for
    them before any chart, so they must not wait on the trial summaries)."""
    rows = session.execute(
        text("SELECT DISTINCT CAST(arm AS TEXT) FROM trials WHERE study_id = :study_id"), {"study_id": study_id}
    ).scalars()
    return [json.loads(r) if r else {} for r in rows]


# Arm and params as JSON text, decoded here on both databases (an arm's text once: a study has a
# few arms and thousands of trials); through the ORM's typed columns the rows cost twice as much.
_SUMMARIES = """
SELECT id, number, CAST(arm AS TEXT) AS arm, CAST(params AS TEXT) AS params, status, objective_value, best_step,
       replica_of, fail_kind, error
FROM trials WHERE study_id = :study_id ORDER BY number
"""


_DECODE = msgspec.json.Decoder().decode


def _params(document: str) -> Any:
    """A trial's params document, decoded in C by msgspec (json.loads was 15 % of the judgement
    every chart starts from at 50,000 trials); json.loads for what only it reads (NaN)."""
    try:
        return _DECODE(document)
    except msgspec.DecodeError:
        return json.loads(document)


def trial_summaries(session: Session, study_id: int) -> list[TrialSummary]:
    """Every trial of the study, by number, with its stored best value and step (`last_step`
    None: `with_last_steps` sets it from the curve statistics)."""
    rows = session.execute(text(_SUMMARIES), {"study_id": study_id}).all()
    arms: dict[str | None, tuple[Any, str]] = {}
    out = []
    # The collector paused while 50,000 summaries are built: they hold no garbage cycles, and its
    # full passes over them as they grew were a fifth of the build (150 of 750 ms).
    with collector_paused():
        for tid, number, arm_text, params, status, objective, best_step, replica_of, fail_kind, error in rows:
            known = arms.get(arm_text)
            if known is None:
                arm = (json.loads(arm_text) if arm_text else None) or {}
                known = arms[arm_text] = (arm, arm_key(arm))
            out.append(
                TrialSummary(
                    id=tid,
                    number=number,
                    arm=known[0],
                    params=(_params(params) if params else None) or {},
                    status=_STATUS[status],
                    objective=objective,
                    best_step=best_step,
                    replica_of=replica_of,
                    fail_kind=fail_kind,
                    error=error,
                    arm_key=known[1],
                )
            )
    return out


def with_last_steps(trials: list[TrialSummary], last_steps: Mapping[int, int]) -> list[TrialSummary]:
    """`trials`, just built by `trial_summaries` and not yet shared, with their `last_step` from
    `last_steps` set in place (50,000 `replace` calls took a tenth of a second)."""
    for t in trials:
        object.__setattr__(t, "last_step", last_steps.get(t.id))
    return trials


_STATUS = {s.value: s.value for s in TrialStatus}  # a stored status, checked (the Enum's call cost 7 % more)


# The best `k` completed original trials of each arm (row_number over the arm). ORDER BY direction
# comes from a fixed pair of strings, never from input. Their curves are a second query by id: in
# one join, Postgres cannot know how few trials the ranking keeps and scans every point.
_BEST_CURVES = """
WITH ranked AS (
    SELECT id, number, row_number() OVER (PARTITION BY CAST(arm AS TEXT) ORDER BY objective_value {direction}, number)
           AS arm_rank
    FROM trials
    WHERE study_id = :study_id AND replica_of IS NULL AND status = 'completed' AND objective_value IS NOT NULL
)
SELECT r.id AS trial_id, r.arm_rank FROM ranked r WHERE r.arm_rank <= :k
"""


def resume_steps(session: Session, trial_ids: Sequence[int]) -> dict[int, int]:
    """Per trial with a resumed history, the earliest step it was resumed from (`Trial.resumed_from_step`)."""
    if not trial_ids:
        return {}
    rows = session.execute(
        select(Trial.id, Trial.resumed_from_step).where(
            Trial.id.in_(list(trial_ids)), Trial.resumed_from_step.is_not(None)
        )
    )
    return {int(r.id): int(r.resumed_from_step) for r in rows}


def best_trial_curves(
    session: Session, study_id: int, mode: str, k: int, names: Sequence[str]
) -> tuple[dict[int, int], dict[int, dict[str, Curve]]]:
    """The best `k` trials of every arm, `{trial_id: rank in its arm}`, and their `names` curves."""
    statement = text(_BEST_CURVES.format(direction="ASC" if mode == "min" else "DESC"))
    rows = session.execute(statement, {"study_id": study_id, "k": k}).all()
    ranks = {r.trial_id: int(r.arm_rank) for r in rows}
    return ranks, curves_of(session, sorted(ranks), names)


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


# The share of updates clipped, from per-step data: the gradient norms above the trial's threshold.
_CLIPPED = """
SELECT avg(CASE WHEN value > :clip THEN 1.0 ELSE 0.0 END) FROM metric_points
WHERE trial_id = :trial_id AND name = :metric AND nonfinite = 0
"""

# Without a known threshold: the last value of the trainer's cumulative series ("the fraction of
# steps clipped so far"), which is the share over the whole run; its mean is not.
_LAST = """
SELECT m.trial_id, m.value FROM metric_points m
JOIN (SELECT trial_id, max(step) AS step FROM metric_points
      WHERE trial_id IN :ids AND name = :metric AND nonfinite = 0 GROUP BY trial_id) l
  ON l.trial_id = m.trial_id AND l.step = m.step
WHERE m.name = :metric
"""


def grad_norm_stats(
    session: Session,
    trial_ids: Sequence[int],
    metric: str = "train/grad_norm",
    clipped: str = "train/clipped_fraction",
    thresholds: Mapping[int, float | None] | None = None,
) -> list[dict[str, Any]]:
    """Per trial: `{trial_id, p90, n}` of the unclipped gradient norm and `clipped_fraction`: the
    share of its reported norms above its clipping threshold (`thresholds`, from its params or
    settings), else the final value of the trainer's cumulative `clipped` series (None when it
    reported neither)."""
    if not trial_ids:
        return []
    rows = session.execute(
        text(_P90).bindparams(bindparam("ids", expanding=True)), {"ids": list(trial_ids), "metric": metric}
    ).all()
    finals = session.execute(
        text(_LAST).bindparams(bindparam("ids", expanding=True)), {"ids": list(trial_ids), "metric": clipped}
    ).all()
    clipped_by: dict[int, float | None] = {r.trial_id: float(r.value) for r in finals}
    for trial_id, clip in (thresholds or {}).items():
        if clip is not None and trial_id in trial_ids:
            share = session.execute(text(_CLIPPED), {"trial_id": trial_id, "metric": metric, "clip": clip}).scalar()
            if share is not None:
                clipped_by[trial_id] = float(share)
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


# Per completed trial and metric (the objective and the losses), in one hash aggregate over the
# study's points (no sort: window functions such as lag or row_number need every point sorted, which
# cost ten times more on Postgres): over the whole run the count, the extremes (`vmax` +Infinity when
# any point is not finite: the divergence rule's "NaN at any step"), the last finite step and the
# value at the metric's first step; over the late points (steps from `cut`, the last quarter of the
# horizon) their count, extremes and the sums of a least-squares line through them (end level,
# slope, residual noise). Only these aggregates leave the database, never the points. A stored
# non-finite value is NULL, which every aggregate but `n` and `vmax` skips.
_LATE = "m.step >= :cut AND m.value IS NOT NULL"
_CURVE_STATS = f"""
SELECT m.trial_id, m.name, count(*) AS n, min(m.value) AS vmin,
       max(CASE WHEN m.nonfinite = 0 THEN m.value ELSE :inf END) AS vmax,
       avg(CASE WHEN m.step = (CASE WHEN m.name = :first_name THEN :first_step ELSE :first_obj END) THEN m.value END)
           AS v0,
       count(CASE WHEN {_LATE} THEN 1 END) AS late_n,
       min(CASE WHEN {_LATE} THEN m.value END) AS late_min,
       max(CASE WHEN {_LATE} THEN m.value END) AS late_max,
       sum(CASE WHEN {_LATE} THEN CAST(m.step - :cut AS DOUBLE PRECISION) END) AS sx,
       sum(CASE WHEN {_LATE} THEN m.value END) AS sy,
       sum(CASE WHEN {_LATE} THEN CAST(m.step - :cut AS DOUBLE PRECISION) * (m.step - :cut) END) AS sxx,
       sum(CASE WHEN {_LATE} THEN (m.step - :cut) * m.value END) AS sxy,
       sum(CASE WHEN {_LATE} THEN m.value * m.value END) AS syy,
       max(CASE WHEN m.value IS NOT NULL THEN m.step END) AS s1
FROM metric_points m
WHERE m.trial_id IN :ids AND m.name IN :names
GROUP BY m.trial_id, m.name
"""
# The aggregates `curve_stats` reads, in the order of the numpy columns below.
_STAT_FIELDS = ("n", "v0", "vmin", "vmax", "late_n", "late_min", "sx", "sy", "sxx", "sxy", "syy", "s1", "late_max")


# Rows of this aggregate (whole-run extremes and count) keep their cut as -(cut + 1): the rows kept
# by the first release of curve_stats (first and late points only) never match it, so those trials
# are aggregated again instead of being read with a different meaning. A version column would say
# this plainly; it needs a migration.
def _stored_cut(cut: int) -> int:
    return -(cut + 1)


@dataclass(frozen=True)
class CurveStats:
    """Per-trial aggregates of one metric's curve, as arrays aligned on `trial_ids`: `first` the
    value at the study's first step of the metric (NaN where unknown), `minimum` and `maximum` over
    the whole run (`maximum` infinite when any point is not finite), `n` the number of points,
    `last_step` the last step with a finite value, `end` the late line's value at the trial's last
    step, `late_noise` the standard deviation of the late points around that line, `late_change`
    the line's change across the late part, `late_min`/`late_max` their extremes."""

    trial_ids: np.ndarray
    n: np.ndarray
    first: np.ndarray
    minimum: np.ndarray
    maximum: np.ndarray
    end: np.ndarray
    late_n: np.ndarray
    late_min: np.ndarray
    late_max: np.ndarray
    late_noise: np.ndarray
    late_change: np.ndarray
    last_step: np.ndarray

    @cached_property
    def _index(self) -> dict[int, int]:
        return {int(t): i for i, t in enumerate(self.trial_ids)}

    def of(self, trial_id: int) -> dict[str, float] | None:
        i = self._index.get(trial_id)
        if i is None:
            return None
        fields = ("n", "first", "minimum", "maximum", "end", "late_n", "late_noise", "late_change")
        return {f: float(getattr(self, f)[i]) for f in fields}


def curve_stats(
    session: Session, study_id: int, names: Sequence[str], horizon: float | None, first_of: str
) -> dict[str, CurveStats]:
    """`{name: CurveStats}` over the study's completed trials (see `_CURVE_STATS`): the late part
    is the last quarter of `horizon` (max_train_steps), `first` is measured for `first_of` only
    (the training loss, for the divergence rule) at the first step one completed trial reported.
    The line through the late points is fitted from the sums in numpy, for all trials at once.
    A completed trial's sums are kept in `curve_stats` (its points no longer change), so only the
    trials that completed since the last call are read point by point."""
    params = _stat_params(session, study_id, names, horizon, first_of)
    if params is None:
        return {}
    cut = params["cut"]
    columns = _kept_or_computed(session, study_id, list(names), params)
    out: dict[str, CurveStats] = {}
    for name in names:
        ids, cols = columns[name]
        k = np.maximum(np.nan_to_num(cols[:, 4]), 1.0)
        mx, my = np.nan_to_num(cols[:, 6]) / k, np.nan_to_num(cols[:, 7]) / k
        vxx = np.maximum(np.nan_to_num(cols[:, 8]) / k - mx**2, 0.0)
        cxy = np.nan_to_num(cols[:, 9]) / k - mx * my
        slope = np.divide(cxy, vxx, out=np.zeros_like(cxy), where=vxx > 0)
        resid = np.maximum(np.nan_to_num(cols[:, 10]) / k - my**2 - slope * cxy, 0.0) * k / np.maximum(k - 2, 1.0)
        width = np.maximum(cols[:, 11] - cut, 0.0)
        late = cols[:, 4] > 0
        out[name] = CurveStats(
            trial_ids=ids,
            n=np.nan_to_num(cols[:, 0]),
            first=cols[:, 1],
            minimum=cols[:, 2],
            maximum=cols[:, 3],
            end=np.where(late, my + slope * (width - mx), np.nan),
            late_n=cols[:, 4],
            late_min=cols[:, 5],
            late_max=cols[:, 12],
            late_noise=np.sqrt(resid),
            late_change=slope * width,
            last_step=cols[:, 11],
        )
    return out


def _stat_params(
    session: Session, study_id: int, names: Sequence[str], horizon: float | None, first_of: str
) -> dict[str, Any] | None:
    """What a study's curve statistics are computed with (the late cut, the first steps, and the
    key their kept rows carry); None before a trial completed."""
    one = session.execute(
        text("SELECT min(id) FROM trials WHERE study_id = :study_id AND status = 'completed'"), {"study_id": study_id}
    ).scalar()
    if one is None:
        return None
    firsts = {
        name: session.execute(
            text("SELECT min(step) FROM metric_points WHERE trial_id = :t AND name = :name AND nonfinite = 0"),
            {"t": one, "name": name},
        ).scalar()
        for name in names
    }
    first_step = firsts.get(first_of)
    other = next((s for n, s in firsts.items() if n != first_of and s is not None), None)
    cut = late_cut(horizon)
    params = {
        "cut": cut,
        "stored_cut": _stored_cut(cut),
        "inf": float("inf"),
        "first_name": first_of,
        "first_step": -1 if first_step is None else int(first_step),
        "first_obj": -1 if other is None else int(other),
    }
    return params


def keep_curve_stats(
    session: Session, study_id: int, names: Sequence[str], horizon: float | None, first_of: str
) -> int:
    """Aggregates and keeps the curve statistics (`curve_stats`, same arguments) of the study's
    ended trials that have none kept yet, without reading the kept ones back; answers how many
    trials it aggregated. The background keeper (`analysis.keeper`) calls this as trials complete,
    so a study page's first visit reads the statistics instead of aggregating every point."""
    params = _stat_params(session, study_id, names, horizon, first_of)
    if params is None:
        return 0
    missing = list(
        session.execute(
            text(_MISSING_STATS).bindparams(bindparam("names", expanding=True)),
            {"study_id": study_id, "names": list(names), "k": len(names), **params},
        ).scalars()
    )
    if not missing:
        return 0
    postgres = on_postgres(session)
    if postgres and _aggregate_and_keep(session, missing, list(names), params) is not None:
        return len(missing)
    attempts = dict(session.execute(select(Trial.id, Trial.attempt).where(Trial.id.in_(missing))).all())
    statement = text(_CURVE_STATS).bindparams(bindparam("ids", expanding=True), bindparam("names", expanding=True))
    fresh: dict[tuple[int, str], dict[str, Any]] = {}
    for start in range(0, len(missing), 1000):
        for r in session.execute(statement, {"ids": missing[start : start + 1000], "names": list(names),
                                             **_aggregate_params(params)}):  # fmt: skip
            fresh[(r.trial_id, r.name)] = {f: getattr(r, f) for f in _STAT_FIELDS}
    _keep(session, missing, list(names), attempts, params, fresh)
    return len(missing)


# The ended trials of a study without a kept row of every name that still holds (the analysis
# reads the completed ones'; the trial table a failed or infeasible one's minimum too).
ENDED = "(" + ", ".join(f"'{s.value}'" for s in FINISHED_STATUSES) + ")"  # an SQL list of constants
_MISSING_STATS = f"""
SELECT t.id FROM trials t
WHERE t.study_id = :study_id AND t.status IN {ENDED}
  AND (SELECT count(*) FROM curve_stats c
       WHERE c.trial_id = t.id AND c.attempt = t.attempt AND c.name IN :names AND c.cut = :stored_cut
         AND c.first_step = :first_step AND c.first_obj = :first_obj) < :k
ORDER BY t.id
"""


_KEPT_STATS = """
SELECT c.trial_id, c.name, {fields}
FROM curve_stats c JOIN trials t ON t.id = c.trial_id
WHERE t.study_id = :study_id AND t.status = 'completed' AND c.attempt = t.attempt AND c.name IN :names
  AND c.cut = :stored_cut AND c.first_step = :first_step AND c.first_obj = :first_obj
"""


def _kept_or_computed(
    session: Session, study_id: int, names: list[str], params: dict[str, Any]
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """By name, the (trial ids, one row of _STAT_FIELDS per trial) of every completed trial with
    points of it: the kept rows that still hold, the others aggregated from the points and kept
    for the next call."""
    if on_postgres(session):
        kept, completed = _kept_columns(session, study_id, names, params)
        attempts: dict[int, int] = {}
    else:
        kept_sql = text(_KEPT_STATS.format(fields=", ".join(f"c.{f}" for f in _STAT_FIELDS)))
        rows = session.execute(
            kept_sql.bindparams(bindparam("names", expanding=True)), {"study_id": study_id, "names": names, **params}
        ).all()
        kept = _columns([tuple(r) for r in rows], names)
        attempts = dict(
            session.execute(
                select(Trial.id, Trial.attempt).where(Trial.study_id == study_id, Trial.status == TrialStatus.completed)
            ).all()
        )
        completed = np.fromiter(attempts, dtype=np.int64, count=len(attempts))
    # A trial is kept when it has a row of every name (`n` 0 where it has no points of one).
    ids, counts = np.unique(np.concatenate([kept[name][0] for name in names]), return_counts=True)
    missing = [int(t) for t in np.setdiff1d(completed, ids[counts >= len(names)])]
    out = {name: (i[c[:, 0] > 0], c[c[:, 0] > 0]) for name, (i, c) in kept.items()}  # n 0: no points at all
    if not missing:
        return out
    fresh_rows: list[tuple[Any, ...]] | None = None
    if on_postgres(session):
        fresh_rows = _aggregate_and_keep(session, missing, names, params)
        if fresh_rows is None:
            attempts = dict(session.execute(select(Trial.id, Trial.attempt).where(Trial.id.in_(missing))).all())
    if fresh_rows is None:
        statement = text(_CURVE_STATS).bindparams(bindparam("ids", expanding=True), bindparam("names", expanding=True))
        fresh: dict[tuple[int, str], dict[str, Any]] = {}
        for start in range(0, len(missing), 1000):  # bounded IN lists
            chunk = missing[start : start + 1000]
            for r in session.execute(statement, {"ids": chunk, "names": names, **_aggregate_params(params)}):
                fresh[(r.trial_id, r.name)] = {f: getattr(r, f) for f in _STAT_FIELDS}
        fresh_rows = [(t, name, *(v[f] for f in _STAT_FIELDS)) for (t, name), v in fresh.items()]
        _keep(session, missing, names, attempts, params, fresh)
    more = _columns([r for r in fresh_rows if r[2]], names)
    return {
        name: (np.concatenate([out[name][0], more[name][0]]), np.vstack([out[name][1], more[name][1]]))
        for name in names
    }


def _columns(rows: Sequence[tuple[Any, ...]], names: Sequence[str]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """(trial_id, name, *_STAT_FIELDS) rows as, by name, (trial ids, a float row per trial)."""
    width = len(_STAT_FIELDS)
    return {
        name: (
            np.array([r[0] for r in rows if r[1] == name], dtype=np.int64),
            np.array([r[2:] for r in rows if r[1] == name], dtype=float).reshape(-1, width),
        )
        for name in names
    }


# Postgres: the kept rows of every name as one row of arrays, read in binary (50,000 trials' rows
# took 1.2 s through SQLAlchemy rows, the arrays a tenth), and the study's completed trials.
_KEPT_COLUMNS = """
SELECT c.name, array_agg(c.trial_id), {fields}
FROM curve_stats c JOIN trials t ON t.id = c.trial_id
WHERE t.study_id = %(study_id)s AND t.status = 'completed' AND c.attempt = t.attempt
  AND c.name = ANY(%(names)s) AND c.cut = %(stored_cut)s AND c.first_step = %(first_step)s
  AND c.first_obj = %(first_obj)s
GROUP BY c.name
"""
_COMPLETED = "SELECT array_agg(id) FROM trials WHERE study_id = %(study_id)s AND status = 'completed'"


def _kept_columns(
    session: Session, study_id: int, names: list[str], params: Mapping[str, Any]
) -> tuple[dict[str, tuple[np.ndarray, np.ndarray]], np.ndarray]:
    """`_kept_or_computed`'s kept rows on Postgres, `n` 0 included, and the completed trials' ids,
    on the session's own connection (its transaction)."""
    fields = ", ".join(f"array_agg(CAST(c.{f} AS double precision))" for f in _STAT_FIELDS)
    raw = session.connection().connection.driver_connection
    values = {"study_id": study_id, "names": names, **{k: params[k] for k in ("stored_cut", "first_step", "first_obj")}}
    width = len(_STAT_FIELDS)
    kept = {name: (np.zeros(0, dtype=np.int64), np.zeros((0, width))) for name in names}
    with raw.cursor(binary=True) as cursor:  # type: ignore[union-attr]
        cursor.execute(_KEPT_COLUMNS.format(fields=fields), values)
        for name, ids, *cols in cursor.fetchall():
            kept[name] = (np.array(ids, dtype=np.int64), np.array(cols, dtype=float).T.reshape(-1, width))
        cursor.execute(_COMPLETED, {"study_id": study_id})
        completed = cursor.fetchone()[0] or []
    return kept, np.array(completed, dtype=np.int64)


# Postgres: aggregate the missing trials' points and keep the rows in one statement per chunk, in
# the database (the aggregate of `_CURVE_STATS` per trial and name, `n` 0 where a trial has no
# point of a name), answering the kept rows. Sending 150,000 rows back to be upserted one by one
# took 4 s of a 50,000-trial study's first visit.
_AGGREGATE_AND_KEEP = f"""
INSERT INTO curve_stats (trial_id, name, attempt, cut, first_step, first_obj, {{fields}})
SELECT t.id, w.name, t.attempt, :stored_cut, :first_step, :first_obj, {{aggregates}}
FROM trials t CROSS JOIN unnest(CAST(:wanted AS varchar[])) AS w(name)
LEFT JOIN ({_CURVE_STATS}) s ON s.trial_id = t.id AND s.name = w.name
WHERE t.id IN :ids
ON CONFLICT (trial_id, name) DO UPDATE SET {{updates}}
RETURNING trial_id, name, {{fields}}
"""


def _aggregate_and_keep(
    session: Session, trial_ids: list[int], names: list[str], params: Mapping[str, Any]
) -> list[tuple[Any, ...]] | None:
    """`_kept_or_computed`'s fresh rows on Postgres (`_AGGREGATE_AND_KEEP`), in a savepoint; None
    when the write fails (a read-only database), and the caller aggregates without keeping."""
    fields = ", ".join(_STAT_FIELDS)
    aggregates = ", ".join("coalesce(s.n, 0)" if f == "n" else f"s.{f}" for f in _STAT_FIELDS)
    kept = ("attempt", "cut", "first_step", "first_obj", *_STAT_FIELDS)
    sql = _AGGREGATE_AND_KEEP.format(
        fields=fields, aggregates=aggregates, updates=", ".join(f"{c} = excluded.{c}" for c in kept)
    )
    statement = text(sql).bindparams(bindparam("ids", expanding=True), bindparam("names", expanding=True))
    values = {**_aggregate_params(params), "stored_cut": params["stored_cut"], "names": names, "wanted": names}
    out: list[tuple[Any, ...]] = []
    try:
        with session.begin_nested():
            for start in range(0, len(trial_ids), 1000):  # bounded IN lists
                chunk = trial_ids[start : start + 1000]
                out += [tuple(r) for r in session.execute(statement, {**values, "ids": chunk}) if r.n]
    except SQLAlchemyError:
        _log.warning("could not keep the curve statistics of %d trials", len(trial_ids), exc_info=True)
        return None
    return out


def _keep(
    session: Session,
    trial_ids: list[int],
    names: list[str],
    attempts: Mapping[int, int],
    params: Mapping[str, Any],
    fresh: Mapping[tuple[int, str], Mapping[str, Any]],
) -> None:
    """Upserts the fresh aggregates (and `n` 0 for a name a trial has no points of), in a
    savepoint: a write that loses a race, or a read-only database, costs only the keeping."""
    empty = dict.fromkeys(_STAT_FIELDS, None) | {"n": 0}
    values = [
        {
            "trial_id": t,
            "name": name,
            "attempt": attempts[t],
            "cut": params["stored_cut"],
            "first_step": params["first_step"],
            "first_obj": params["first_obj"],
            **fresh.get((t, name), empty),
        }
        for t in trial_ids
        for name in names
    ]
    keep_rows(session, CurveStat, values, f"curve statistics of {len(trial_ids)} trials")


def _aggregate_params(params: Mapping[str, Any]) -> dict[str, Any]:
    """The parameters `_CURVE_STATS` names (the kept rows' lookup has more)."""
    return {k: params[k] for k in ("cut", "inf", "first_name", "first_step", "first_obj")}


def late_cut(horizon: float | None) -> int:
    """The first step of the "late" part of training: the last quarter of the horizon."""
    return int(0.75 * horizon) if horizon else 0


def late_points(session: Session, trial_ids: Sequence[int], name: str, cut: int) -> dict[int, Curve]:
    """The points of `name` from step `cut` on, for a few trials (through the primary key)."""
    if not trial_ids:
        return {}
    statement = text(
        "SELECT trial_id, name, step, value, nonfinite FROM metric_points "
        "WHERE trial_id IN :ids AND name = :name AND step >= :cut ORDER BY trial_id, step"
    ).bindparams(bindparam("ids", expanding=True))
    found = _curves(session.execute(statement, {"ids": list(trial_ids), "name": name, "cut": cut}))
    return {tid: by_name[name] for tid, by_name in found.items() if name in by_name}


def class_count(session: Session, study_id: int, prefix: str) -> int | None:
    """How many classes the trainer reported per-class counts for (`{prefix}correct/class_K`), from
    one completed trial; None when it reports none (then chance is unknown)."""
    one = session.execute(
        text("SELECT min(id) FROM trials WHERE study_id = :study_id AND status = 'completed'"), {"study_id": study_id}
    ).scalar()
    if one is None:
        return None
    n = session.execute(
        text("SELECT count(*) FROM (SELECT DISTINCT name FROM metric_points WHERE trial_id = :t AND name LIKE :p) s"),
        {"t": one, "p": f"{prefix}correct/class_%"},
    ).scalar()
    return int(n) if n else None


def horizon(session: Session, study: StudyInfo) -> float | None:
    """max_train_steps from the spec's trainer settings, else the last step any trial reported."""
    steps = (study.spec.get("trainer") or {}).get("max_train_steps")
    if isinstance(steps, (int, float)) and not isinstance(steps, bool) and steps > 0:
        return float(steps)
    last = last_step(session, study.id, study.metric)
    return float(last) if last else None


def last_step(session: Session, study_id: int, metric: str) -> int | None:
    """The largest step any trial of the study reported for `metric` (the horizon when the spec
    has no max_train_steps)."""
    # On Postgres a chunk knows its last step: a row per batch instead of every point unnested
    # (50,000 trials x 20 evaluations: 60 ms instead of 440 ms).
    table, step = ("metric_chunks", "last_step") if on_postgres(session) else ("metric_points", "step")
    value = session.execute(
        text(
            f"SELECT max(m.{step}) FROM {table} m JOIN trials t ON t.id = m.trial_id "
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


def unread_by_trial(session: Session, study_id: int) -> dict[int, list[str]]:
    """`{trial_id: names}` for the study's trials whose script missed at least one hyperparameter."""
    rows = session.execute(
        select(Trial.id, Trial.unread_params).where(
            Trial.study_id == study_id,
            Trial.unread_params.is_not(None),
            cast(Trial.unread_params, String) != "[]",
        )
    )
    return {tid: list(names) for tid, names in rows if names}
