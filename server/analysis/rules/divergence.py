"""Which completed trials diverged, judged from their stored curves by the one definition the
trainer uses too (`hpo.trainer.divergence.judge`; its doc lists the rules and their playbook
sections), and which trial is each arm's best once lone glitched evaluations are set aside.

Playbook (002), "Identifying unstable workloads", Figure 7a: an infeasible trial "either produces
NaNs or uncharacteristically high values of the loss". The trainer ends such runs itself; this
module applies the same function to the curves a study stored, so trials run by other trainers
(user scripts, older runs) are judged alike. Every consumer (the analysis, every chart and plot,
the CSV, replicas) reads the trials through `load_trials`, so they all mark the same trials
infeasible and name the same best trial.

Cost: the per-trial curve statistics (load.curve_stats, one hash aggregate, kept between calls)
pick the *candidates*: a trial can only be judged diverged when a statistic allows it (a
non-finite point, a maximum above `factor` times the initial value, a late part (the last quarter
of max_train_steps) reaching no lower than the margin below the initial loss or chance, fewer late
points than the last tenth of the curve that the end level reads). Only the candidates' curves
are read and judged; every other trial is feasible by construction. Judged trials count as
infeasible everywhere: the infeasible fraction and its warning, the instability hint, red crosses
on the axis plots and charts, and they leave the best-of-k bootstrap."""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from hpo.server.analysis.aliases import aliases_of, metric_name
from hpo.server.analysis.model import Curve, TrialSummary
from hpo.trainer.divergence import END_POINTS, TRAIN_LOSS, Rule, Series, chance_of, is_loss, judge

# The best few feasible trials of each arm are checked for a lone outlier at their best step.
if TYPE_CHECKING:  # annotations only: the rules take plain values, never a database
    from hpo.server.analysis import load

BEST_FEW = 3


def chance_level(metric: str, classes: int | None) -> float | None:
    """The objective of an uninformed classifier over `classes` classes, where the metric's name
    says what it measures; None otherwise."""
    found = chance_of(metric, classes)
    return None if found is None else found[0]


def curve_names(metric: str, train_loss: str = TRAIN_LOSS) -> list[str]:
    """The curves the rule reads: the objective, the training loss (`train_loss`: the script's own
    name where `analysis.aliases` maps one onto `train/loss`) and the validation loss (the
    objective's prefix with `loss`: `valid/loss` for `valid/error_rate`)."""
    prefix = metric.rsplit("/", 1)[0] + "/" if "/" in metric else ""
    return sorted({metric, train_loss, prefix + "loss"})


def train_loss_name(study: load.StudyInfo) -> str:
    """The name the study's trials report their training loss under: `train/loss`, or the
    script's own name that the spec's `analysis.aliases` maps onto it (docs/analysis.md, "Aliases")."""
    return metric_name(aliases_of(study.spec), TRAIN_LOSS)


def rule_of(study: load.StudyInfo) -> Rule:
    """The thresholds the study's trainer settings ask for (the trainer reads the same ones)."""
    return Rule.of(dict(study.spec.get("trainer") or {}))


def _judged(t: TrialSummary) -> bool:
    """Completed with a finite objective: the trials whose feasibility the curves decide (a
    trial without a finite objective is infeasible already)."""
    return t.status == "completed" and t.objective is not None and math.isfinite(t.objective)


def diverged(
    curves: Mapping[str, Curve],
    metric: str,
    mode: str,
    chance: tuple[float, float] | None,
    rule: Rule,
    train_loss: str = TRAIN_LOSS,
) -> str | None:
    """`hpo.trainer.divergence.judge` on one trial's stored curves (`train_loss`: the name its
    training loss is stored under)."""
    series = {name: Series(c.steps, c.values) for name, c in curves.items()}
    return judge(series, metric, mode, chance=chance, rule=rule, train_loss=train_loss)


def candidates(
    stats: Mapping[str, load.CurveStats],
    trial_ids: Iterable[int],
    objective: str,
    mode: str,
    chance: tuple[float, float] | None,
    rule: Rule,
) -> set[int]:
    """The trials among `trial_ids` whose statistics allow the rule to judge them diverged (a
    superset of those it does; see the module doc), vectorized over every trial."""
    wanted = set(trial_ids)
    out: set[int] = set()
    has_train = set(stats[TRAIN_LOSS].trial_ids.tolist()) if TRAIN_LOSS in stats else set()
    for name, s in stats.items():
        if not len(s.trial_ids):
            continue
        with np.errstate(invalid="ignore"):
            flag = ~np.isfinite(s.maximum)  # a non-finite point somewhere (NaN is stored as +inf here)
            # the end level reads the last tenth of the points: the late part's extremes bound it
            # only when that tenth lies inside the late part
            few = s.late_n < np.maximum(END_POINTS, np.ceil(0.1 * s.n))
            if is_loss(name):
                unknown = ~np.isfinite(s.first)
                if rule.factor is not None:
                    flag |= unknown | (s.maximum > rule.factor * s.first)
                own = np.array([name == TRAIN_LOSS or int(t) not in has_train for t in s.trial_ids], dtype=bool)
                flag |= own & (unknown | few | (s.late_max >= (1.0 - rule.margin) * s.first))
            if name == objective and chance is not None:
                level, perfect = chance
                margin = rule.margin * abs(perfect - level)
                worst = s.late_max >= level - margin if mode == "min" else s.late_min <= level + margin
                flag |= few | worst
        out.update(int(t) for t in s.trial_ids[flag] if int(t) in wanted)
    return out


def _last_steps(stats: Mapping[str, load.CurveStats]) -> dict[int, int]:
    """Each trial's last step with a finite value, over the curves the rule reads."""
    out: dict[int, int] = {}
    for s in stats.values():
        for tid, step in zip(s.trial_ids.tolist(), s.last_step.tolist(), strict=True):
            if math.isfinite(step):
                out[tid] = max(out.get(tid, 0), int(step))
    return out


def best_ranks(trials: Iterable[TrialSummary], sign: float, few: int) -> dict[int, int]:
    """`{trial_id: rank in its arm}` of the best `few` feasible original trials of each arm, by
    the analysis' objective (lone outliers set aside), ties by trial number."""
    groups: dict[str, list[TrialSummary]] = {}
    for t in trials:
        if t.feasible and t.replica_of is None:
            groups.setdefault(t.arm_key, []).append(t)
    out: dict[int, int] = {}
    for group in groups.values():
        group.sort(key=lambda t: (sign * float(t.objective or 0.0), t.number))
        out.update({t.id: rank for rank, t in enumerate(group[:few], start=1)})
    return out


def without_outlier(trial: TrialSummary, curve: Curve) -> Curve:
    """The trial's objective curve without the evaluation set aside as a lone outlier."""
    if trial.outlier_step is None:
        return curve
    keep = curve.steps != trial.outlier_step
    return Curve(curve.steps[keep], curve.values[keep])


def _feasible_groups(trials: Iterable[TrialSummary]) -> list[list[int]]:
    """The ids of the feasible trials by arm, and the replicas of each trial apart."""
    groups: dict[tuple[str, int | None], list[int]] = {}
    for t in trials:
        if t.feasible:
            groups.setdefault((t.arm_key, t.replica_of), []).append(t.id)
    return list(groups.values())


def _best_few(groups: Sequence[Sequence[int]], by_id: Mapping[int, TrialSummary], sign: float, few: int) -> list[int]:
    """The best `few` of each group, by the trials' objectives in `by_id` now."""

    def rank(tid: int) -> tuple[float, int]:
        t = by_id[tid]
        return (sign * float(t.objective or 0.0), t.number)

    out: list[int] = []
    for group in groups:  # nsmallest: sorted(...)[:few] without sorting 50,000 trials
        out.extend(heapq.nsmallest(few, group, key=rank))
    return out
