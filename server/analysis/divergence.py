"""Completed trials that diverged with finite values, judged from their stored curves.

Playbook (002), "Identifying unstable workloads", Figure 7a: an infeasible trial "either produces
NaNs or uncharacteristically high values of the loss". The trainer ends such runs itself
(hpo.trainer.divergence); this module applies the same rule to the curves a study stored, so trials
run by other trainers (user scripts, older runs) are judged alike:

- diverged: its `train/loss` stays above `factor` times its initial loss (the value at the study's
  first logged step) from some point of the last quarter of max_train_steps to the end, for at
  least 3 points and a tenth of that quarter's points (the trainer's rule, with "a sustained
  stretch" read as "to the end of training"; a trainer's running minimum is never above its
  initial value, so the initial value sets the threshold). The per-trial aggregates pick the
  candidates in the database (their late maximum is that high); only the candidates' late points
  are read;
- no better than chance: where chance is known, the trial's best objective is no better than
  chance (within `CHANCE_MARGIN` of it). Chance is known when the trainer reports per-class counts
  (`valid/correct/class_K`, as hpo's classification workloads do): error rate 1 - 1/K, accuracy
  1/K, cross-entropy ln K.

Such trials count as infeasible everywhere: the infeasible fraction and its warning, the
instability hint, red crosses on the axis plots, and they leave the best-of-k bootstrap."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace

import numpy as np
from sqlalchemy.orm import Session

from hpo.trainer.divergence import DEFAULT_FACTOR

from . import memo, queries
from .model import Curve, TrialSummary, fmt

TRAIN_LOSS = "train/loss"
# "No better than chance": the best value is within this share of chance's own value from it.
CHANCE_MARGIN = 0.02


def chance_level(metric: str, classes: int | None) -> float | None:
    """The objective of an uninformed classifier over `classes` classes, where the metric's name
    says what it measures; None otherwise."""
    if not classes or classes < 2:
        return None
    leaf = metric.rsplit("/", 1)[-1]
    if leaf == "error_rate":
        return 1.0 - 1.0 / classes
    if leaf == "accuracy":
        return 1.0 / classes
    if leaf == "loss":
        return math.log(classes)
    return None


def load_trials(
    session: Session, study: queries.StudyInfo, horizon: float | None = None, *, factor: float = DEFAULT_FACTOR
) -> tuple[list[TrialSummary], dict[str, queries.CurveStats]]:
    """The study's trial summaries with diverged completed trials marked (`diverged` holds the
    reason), and the per-trial curve statistics of the objective and the training loss (`horizon`
    is max_train_steps; looked up when not given). Kept per study version (`memo`): every chart
    and the analysis start from it, and it reads every curve of the study."""
    if horizon is None:
        horizon = queries.horizon(session, study)
    trials, stats = memo.in_session(
        session,
        study.id,
        ("load_trials", horizon, factor),
        lambda: _load_trials(session, study, horizon, factor),
        live=False,  # a running trial's best value follows its newest points
    )
    return list(trials), stats


def _load_trials(
    session: Session, study: queries.StudyInfo, horizon: float | None, factor: float
) -> tuple[list[TrialSummary], dict[str, queries.CurveStats]]:
    trials = queries.trial_summaries(session, study.id)
    names = sorted({study.metric, TRAIN_LOSS})
    stats = queries.curve_stats(session, study.id, names, horizon, TRAIN_LOSS)
    prefix = study.metric.rsplit("/", 1)[0] + "/" if "/" in study.metric else ""
    chance = chance_level(study.metric, queries.class_count(session, study.id, prefix))
    train = stats.get(TRAIN_LOSS)
    late: dict[int, Curve] = {}
    if train is not None and len(train.trial_ids):
        with np.errstate(invalid="ignore"):
            candidates = train.trial_ids[(train.first > 0) & (train.late_max > factor * train.first)]
        late = queries.late_points(session, [int(i) for i in candidates], TRAIN_LOSS, queries.late_cut(horizon))
    reasons = judge(trials, train, late, study.mode, chance, factor)
    return [replace(t, diverged=reasons[t.id]) if t.id in reasons else t for t in trials], stats


def judge(
    trials: Sequence[TrialSummary],
    train: queries.CurveStats | None,
    late: Mapping[int, Curve],
    mode: str,
    chance: float | None,
    factor: float = DEFAULT_FACTOR,
) -> dict[int, str]:
    """`{trial_id: reason}` for the completed trials judged diverged: `late` holds the late
    training-loss points of the candidates (see the module doc)."""
    out: dict[int, str] = {}
    if train is not None and len(train.trial_ids):
        first = dict(zip(train.trial_ids.tolist(), train.first.tolist(), strict=True))
        for trial_id, curve in late.items():
            initial = first.get(trial_id, math.nan)
            values = curve.values
            high = np.nan_to_num(values, nan=np.inf) > factor * initial
            # the length of the run of high values that reaches the end of training
            run = len(high) - int(np.nonzero(~high)[0][-1]) - 1 if (~high).any() else len(high)
            if initial > 0 and run >= max(3, math.ceil(0.1 * len(values))):
                since = int(curve.steps[len(high) - run])
                out[trial_id] = (
                    f"training loss diverged: above {factor:g}x its initial value {fmt(initial)} from step {since} to "
                    f"the end (last {fmt(float(values[-1]))})"
                )
    if chance is not None:
        sign = 1.0 if mode == "min" else -1.0
        margin = CHANCE_MARGIN * abs(chance)
        for t in trials:
            usable = t.status == "completed" and t.objective is not None and t.id not in out
            if usable and sign * t.objective >= sign * chance - margin:  # type: ignore[operator]
                out[t.id] = f"no better than chance: best value {fmt(t.objective)}, chance {fmt(chance)}"
    return out
