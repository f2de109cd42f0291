"""Completed trials that diverged with finite values, judged from their stored curves.

Playbook (002), "Identifying unstable workloads", Figure 7a: an infeasible trial "either produces
NaNs or uncharacteristically high values of the loss". The trainer ends such runs itself
(hpo.trainer.divergence); this module applies the same rule to the curves a study stored, so trials
run by other trainers (user scripts, older runs) are judged alike:

- diverged: every one of its late `train/loss` points (the last quarter of max_train_steps, 3 at
  least) is above `factor` times its initial loss (the trainer's rule, with "a sustained stretch"
  read as "the whole end of training"; a trainer's running minimum is never above its initial
  value, so the initial value sets the threshold);
- no better than chance: where chance is known, the trial's best objective is no better than
  chance (within `CHANCE_MARGIN` of it). Chance is known when the trainer reports per-class counts
  (`valid/correct/class_K`, as hpo's classification workloads do): error rate 1 - 1/K, accuracy
  1/K, cross-entropy ln K.

Such trials count as infeasible everywhere: the infeasible fraction and its warning, the
instability hint, red crosses on the axis plots, and they leave the best-of-k bootstrap."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

import numpy as np
from sqlalchemy.orm import Session

from hpo.trainer.divergence import DEFAULT_FACTOR

from . import queries
from .model import TrialSummary, fmt

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
    is max_train_steps; looked up when not given)."""
    trials = queries.trial_summaries(session, study.id)
    names = sorted({study.metric, TRAIN_LOSS})
    if horizon is None:
        horizon = queries.horizon(session, study)
    stats = queries.curve_stats(session, study.id, names, horizon, TRAIN_LOSS)
    prefix = study.metric.rsplit("/", 1)[0] + "/" if "/" in study.metric else ""
    chance = chance_level(study.metric, queries.class_count(session, study.id, prefix))
    reasons = judge(trials, stats.get(TRAIN_LOSS), study.mode, chance, factor)
    return [replace(t, diverged=reasons[t.id]) if t.id in reasons else t for t in trials], stats


def judge(
    trials: Sequence[TrialSummary],
    train: queries.CurveStats | None,
    mode: str,
    chance: float | None,
    factor: float = DEFAULT_FACTOR,
) -> dict[int, str]:
    """`{trial_id: reason}` for the completed trials judged diverged (vectorized over trials)."""
    out: dict[int, str] = {}
    if train is not None and len(train.trial_ids):
        with np.errstate(invalid="ignore"):
            high = (train.late_n >= 3) & (train.first > 0) & (train.late_min > factor * train.first)
        for i in high.nonzero()[0]:
            out[int(train.trial_ids[i])] = (
                f"training loss diverged: it stays above {fmt(float(train.late_min[i]))} to the end, over {factor:g}x "
                f"its initial value {fmt(float(train.first[i]))}"
            )
    if chance is not None:
        sign = 1.0 if mode == "min" else -1.0
        margin = CHANCE_MARGIN * abs(chance)
        for t in trials:
            usable = t.status == "completed" and t.objective is not None and t.id not in out
            if usable and sign * t.objective >= sign * chance - margin:  # type: ignore[operator]
                out[t.id] = f"no better than chance: best value {fmt(t.objective)}, chance {fmt(chance)}"
    return out
