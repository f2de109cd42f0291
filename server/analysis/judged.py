"""A study's trials as the analysis reads them: loaded once per study version with their curve
statistics, each judged by the one definition of diverged (analysis.rules.divergence), and a
lone outlier evaluation at a trial's best step set aside."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from sqlalchemy.orm import Session

from hpo.server.analysis import load
from hpo.server.analysis.model import TrialSummary
from hpo.server.analysis.rules.divergence import (
    BEST_FEW,
    _best_few,
    _feasible_groups,
    _judged,
    _last_steps,
    candidates,
    curve_names,
    diverged,
    rule_of,
    train_loss_name,
)
from hpo.server.analysis.rules.outliers import robust_best
from hpo.server.cache import memo
from hpo.trainer.divergence import TRAIN_LOSS, Rule, chance_of


def load_trials(
    session: Session, study: load.StudyInfo, horizon: float | None = None
) -> tuple[list[TrialSummary], dict[str, load.CurveStats]]:
    """The study's trial summaries with diverged completed trials marked (`diverged` holds the
    reason), lone outlier evaluations set aside from the best few of each arm (`outlier`, and
    `objective`/`best_step` moved to the best genuine evaluation), each trial's `last_step`, and
    the per-trial curve statistics of the objective and the losses (`horizon` is max_train_steps;
    looked up when not given). Kept per study version (`memo`): every chart and the analysis start
    from it."""
    if horizon is None:
        horizon = load.horizon(session, study)
    rule = rule_of(study)
    trials, stats = memo.in_session(
        session,
        study.id,
        ("load_trials", horizon, rule, train_loss_name(study)),
        lambda: _load_trials(session, study, horizon, rule),
        live=False,  # a running trial's best value follows its newest points
    )
    return list(trials), stats


def _load_trials(
    session: Session, study: load.StudyInfo, horizon: float | None, rule: Rule
) -> tuple[list[TrialSummary], dict[str, load.CurveStats]]:
    train = train_loss_name(study)
    names = curve_names(study.metric, train)
    # The summaries are built beside the curve statistics, which mostly wait on Postgres (at
    # 50,000 trials each took 0.6-0.9 s of a fresh server's first chart, one after the other).
    summaries = load.beside(session, lambda other: load.trial_summaries(other, study.id))
    stats = load.curve_stats(session, study.id, names, horizon, train)
    if train != TRAIN_LOSS:  # a script's training loss is filed under hpo's name, for every reader
        stats = {TRAIN_LOSS if n == train else n: s for n, s in stats.items() if n != TRAIN_LOSS}
    trials = load.with_last_steps(summaries.result(), _last_steps(stats))
    prefix = study.metric.rsplit("/", 1)[0] + "/" if "/" in study.metric else ""
    chance = chance_of(study.metric, load.class_count(session, study.id, prefix))
    judged = [t for t in trials if _judged(t)]
    ids = candidates(stats, [t.id for t in judged], study.metric, study.mode, chance, rule)
    curves = load.curves_of(session, sorted(ids), names) if ids else {}
    reasons = {
        tid: reason
        for tid in ids
        if (reason := diverged(curves.get(tid, {}), study.metric, study.mode, chance, rule, train)) is not None
    }
    marked = [replace(t, diverged=reasons[t.id]) if t.id in reasons else t for t in trials]
    return set_outliers_aside(session, marked, study.metric, study.mode), stats


def set_outliers_aside(
    session: Session, trials: Sequence[TrialSummary], metric: str, mode: str, few: int = BEST_FEW
) -> list[TrialSummary]:
    """The trials with a lone outlier evaluation at the best step of any of each arm's best `few`
    feasible trials set aside (`outliers.robust_best`): such a trial's objective becomes its best
    genuine evaluation, and the best few are looked at again until none has one (a glitched 0.0
    must not become the study's best). Replicas are judged too: their values are trial variance."""
    sign = 1.0 if mode == "min" else -1.0
    by_id = {t.id: t for t in trials}
    groups = _feasible_groups(trials)  # setting an outlier aside keeps a trial feasible
    seen: set[int] = set()
    for _ in range(4):  # each round reads a few curves; a study with glitches in every best trial stops here
        fresh = [tid for tid in _best_few(groups, by_id, sign, few) if tid not in seen]
        if not fresh:
            break
        seen.update(fresh)
        curves = load.curves_of(session, fresh, [metric])
        for tid in fresh:
            curve = curves.get(tid, {}).get(metric)
            found = robust_best(curve, sign) if curve is not None else None
            if found is not None:
                by_id[tid] = replace(
                    by_id[tid],
                    objective=found.value,
                    best_step=found.step,
                    outlier=found.reason,
                    outlier_step=found.outlier_step,
                )
    return [by_id[t.id] for t in trials]


def study_best(session: Session, study_id: int) -> TrialSummary | None:
    """The study's best trial as the analysis decides it (docs/analysis.md, "Which trials count"): the best
    original trial that is feasible (not judged diverged, its lone outlier evaluations set aside),
    or still running; replicas never. `GET /studies/{id}` and `studies.csv` read this."""
    study = load.study_info(session, study_id)
    sign = 1.0 if study.mode == "min" else -1.0
    trials, _ = load_trials(session, study)
    usable = [
        t
        for t in trials
        if t.replica_of is None and (t.feasible or (t.status == "running" and t.objective is not None))
    ]
    return min(usable, key=lambda t: (sign * float(t.objective or 0.0), t.id), default=None)
