"""`analyze_study`: the playbook's post-study checklist, run for the person ("Extracting insight
from experimental results" and the sections after it).

Loading happens in one transaction (load.py, where the database does the heavy lifting); the
checks are plain functions over plain data (boundary.py, diagnostics.py, budget.py, ...)."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from sqlalchemy.orm import Session

from hpo.server.analysis import load as queries
from hpo.server.analysis.aliases import aliases_of, filed, metric_name, renamed_study, renamed_trials
from hpo.server.analysis.judged import load_trials
from hpo.server.analysis.load import unread_by_trial
from hpo.server.analysis.model import Curve, TrialSummary, arm_key, fmt, warning
from hpo.server.analysis.rules.arms import arm_summaries, comparison, comparison_warnings, trial_variance
from hpo.server.analysis.rules.boundary import boundary_warnings, check_boundaries
from hpo.server.analysis.rules.budget import best_of_k, flattened
from hpo.server.analysis.rules.curves import (
    OBJECTIVE_TRAIN,
    curve_report,
    exempt_trials,
    overfitting_screen,
    regularizers,
    screen_warnings,
)
from hpo.server.analysis.rules.diagnostics import late_noise
from hpo.server.analysis.rules.divergence import best_ranks, without_outlier
from hpo.server.analysis.rules.feasibility import (
    infeasible_summary,
    infeasible_warnings,
    instability_warnings,
    loss_instability_warnings,
    neighbours_above_best,
)
from hpo.server.analysis.rules.isolation import isolation_series
from hpo.server.analysis.rules.stopped import concluding, stopped_short, stopped_short_caveat, stopped_short_warnings
from hpo.server.analysis.rules.training import (
    best_step_summary,
    caveats,
    clipping_warnings,
    grad_clip_summary,
    max_train_steps_warnings,
    warmup_warnings,
)
from hpo.server.analysis.rules.unread import study_warnings as unread_warnings
from hpo.server.analysis.skipped import (
    best_step_skips,
    budget_skips,
    curve_skips,
    instability_skips,
    merged,
    name_skips,
)
from hpo.server.bayesian.view import bayesian_view
from hpo.server.cache import memo
from hpo.server.db import Database
from hpo.server.models import resumed
from hpo.server.space.search_space import Dimension, dimensions

BEST_FEW = 3
GRAD_NORM = "train/grad_norm"


@dataclass(frozen=True)
class StudyData:
    """Everything the analysis reads, loaded in one snapshot."""

    study: queries.StudyInfo
    trials: list[TrialSummary]
    ranks: dict[int, int]
    curves: dict[int, dict[str, Curve]]
    grad: list[dict[str, Any]]
    horizon: float | None
    stats: dict[str, queries.CurveStats]
    # Training-loss curves of the trials just above each arm's best learning rate (instability).
    above_best: dict[int, Curve]
    # Arms' best trials whose best value came from a resumed attempt: id -> the step resumed from.
    resumed: dict[int, int] = field(default_factory=dict)
    # Hyperparameters that never reached the script (unread.study_warnings), in the spec's names.
    unread_warnings: list[dict[str, Any]] = field(default_factory=list)

    @property
    def sign(self) -> float:
        return 1.0 if self.study.mode == "min" else -1.0

    @property
    def dims(self) -> list[Dimension]:
        return dimensions(self.study.spec)

    @property
    def trainer(self) -> dict[str, Any]:
        return dict(self.study.spec.get("trainer") or {})


def analyze_study(db: Database, study_id: int) -> dict[str, Any]:
    """The analysis of a study in the shape docs/api.md ("Analysis and plots") documents
    (`study_id, objective, infeasible_fraction, arms, warnings, caveats, max_train_steps,
    grad_clip`, plus `boundary, infeasible, curves, budget, isolation` with the numbers behind
    every warning). Raises `NotFound` for an unknown study. Works on a study that is still
    running: unfinished trials are counted, never judged."""
    return {**_checklist(db, study_id), "bayesian": json_safe(bayesian_view(db, study_id))}


def kept_analysis(db: Database, study_id: int) -> dict[str, Any]:
    """`analyze_study` for the API and the study page: the checklist kept per study version while
    no trial runs, in this process (`memo`; at 50,000 trials it took 4 s on every call) and in the
    database for any server (`kept_charts`, a fresh one took 3.3-4.5 s), the Bayesian view read each
    time (the proposal queue changes it between trials). The checklist is its JSON read back
    whether kept or computed, so both answer the same. Its parts are shared: read, never change."""
    checklist = memo.remember(db, study_id, "analysis-checklist", lambda: _kept_checklist(db, study_id), live=False)
    return {**checklist, "bayesian": json_safe(bayesian_view(db, study_id))}


def _kept_checklist(db: Database, study_id: int) -> dict[str, Any]:
    from hpo.server.cache.kept import ANALYSIS, read_or_compute  # kept_charts reads this package's memo

    body = read_or_compute(db, study_id, ANALYSIS, lambda: json.dumps(_checklist(db, study_id)).encode())
    return dict(json.loads(body))


def _checklist(db: Database, study_id: int) -> dict[str, Any]:
    with db.transaction() as session:
        data = load(session, study_id)
    return json_safe(analysis_of(data))


def load(session: Session, study_id: int, *, best_few: int = BEST_FEW) -> StudyData:
    """Loads the study, its trial summaries, the curves of the best few trials per arm and the
    gradient-norm statistics of each arm's best trial."""
    study = queries.study_info(session, study_id)
    horizon = horizon_of(session, study)
    trials, stats = load_trials(session, study, horizon)
    varied = [d.name for d in dimensions(study.spec) if d.role != "fixed"]
    unread = unread_warnings(unread_by_trial(session, study_id), {t.id: t.number for t in trials}, varied)
    aliases = aliases_of(study.spec)  # the script's own names read as hpo's (docs/analysis.md, "Aliases")
    study, trials = renamed_study(study, aliases), renamed_trials(trials, aliases)
    train_name, grad_name = metric_name(aliases, OBJECTIVE_TRAIN), metric_name(aliases, GRAD_NORM)
    sign = 1.0 if study.mode == "min" else -1.0
    ranks, curves = best_curves(session, trials, study.metric, sign, best_few, [train_name])
    if train_name != OBJECTIVE_TRAIN:
        curves = {tid: filed(series, train_name, OBJECTIVE_TRAIN) for tid, series in curves.items()}
    arms = arm_summaries(trials, sign)
    best_ids = [a["best_trial_id"] for a in arms if a["best_trial_id"] is not None]
    fixed = {d.name: d.value for d in dimensions(study.spec) if d.role == "fixed"}
    settings = {**dict(study.spec.get("trainer") or {}), **fixed}
    by_id = {t.id: t for t in trials}
    clips = {tid: _clip_norm({**settings, **by_id[tid].params}) for tid in best_ids}
    grad = queries.grad_norm_stats(session, best_ids, metric=grad_name, thresholds=clips)
    above = [t.id for _, _, _, group in neighbours_above_best(dimensions(study.spec), trials, sign) for t in group]
    above_curves = queries.curves_of(session, above, [train_name]) if above else {}
    above_curves = {tid: filed(series, train_name, OBJECTIVE_TRAIN) for tid, series in above_curves.items()}
    return StudyData(
        study=study,
        trials=trials,
        ranks=ranks,
        curves=curves,
        grad=grad,
        horizon=horizon,
        stats=stats,
        above_best={tid: c[OBJECTIVE_TRAIN] for tid, c in above_curves.items() if OBJECTIVE_TRAIN in c},
        resumed={
            tid: step
            for tid, step in queries.resume_steps(session, best_ids).items()
            if resumed(by_id[tid].best_step, step)
        },
        unread_warnings=unread,
    )


def best_curves(
    session: Session, trials: Sequence[TrialSummary], metric: str, sign: float, few: int, extra: Sequence[str] = ()
) -> tuple[dict[int, int], dict[int, dict[str, Curve]]]:
    """The best `few` feasible original trials of each arm as the analysis ranks them
    (`divergence.best_ranks`: diverged trials and lone outlier evaluations left out), and their
    curves of `metric` and `extra`, the objective without its outlier evaluation."""
    ranks = best_ranks(trials, sign, few)
    curves = queries.curves_of(session, sorted(ranks), sorted({metric, *extra}))
    by_id = {t.id: t for t in trials}
    for tid, series in curves.items():
        if metric in series and tid in by_id:
            series[metric] = without_outlier(by_id[tid], series[metric])
    return ranks, curves


def _clip_norm(settings: Mapping[str, Any]) -> float | None:
    value = settings.get("grad_clip_norm")
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0 else None


def analysis_of(data: StudyData) -> dict[str, Any]:
    """Runs every check on loaded data (no database needed)."""
    sign, dims, trials, study = data.sign, data.dims, data.trials, data.study
    arms = arm_summaries(trials, sign)
    short = stopped_short(trials, data.trainer)
    judged = concluding(trials, short)  # trials that stopped short leave the boundary and budget conclusions
    floors = noise_floors(arms, late_noise_by_arm(trials, data.stats.get(study.metric)))
    boundary = check_boundaries(dims, judged, sign, noise=floors)
    infeasible = infeasible_summary(trials, dims, study.metric)
    exempt = exempt_trials(dims, trials)
    curves, curve_warns = curve_report(_ranked(data, arms), data.curves, study.metric, sign, data.horizon, exempt)
    screen = overfitting_screen(trials, data.stats.get(study.metric), data.stats.get(OBJECTIVE_TRAIN), sign, exempt)
    warned = {w["trial_id"] for w in curve_warns if w["kind"] == "overfitting"}
    steps = best_step_summary(judged, sign, data.horizon, data.stats.get(study.metric))
    grad = grad_clip_summary(data.grad, arms)
    noise = evaluation_noise(data)
    budget, budget_warns = budgets(judged, arms, sign, study.metric, noise)
    if any(c.side for c in boundary):
        budget_warns = []  # more trials in a space that is too narrow help little: widen it first
    cmp = comparison(arms, sign)
    skipped = merged(
        [
            *curve_skips(_ranked(data, arms), data.curves, study.metric),
            *instability_skips(dims, trials, sign, data.above_best),
            *best_step_skips(steps),
            *budget_skips(arms, budget),
            *name_skips(dims, data.trainer, data.grad),
        ]
    )
    edge = instability_warnings(dims, trials, sign)
    warnings = [
        *data.unread_warnings,
        *infeasible_warnings(infeasible),
        *outlier_warnings(trials, study.metric),
        *stopped_short_warnings(short, trials),
        *boundary_warnings(boundary, len(arms)),
        *edge,
        *loss_instability_warnings(dims, trials, sign, data.above_best, skip={w["param"] for w in edge}),
        *curve_warns,
        *screen_warnings(screen, warned, study.metric),
        *max_train_steps_warnings(steps),
        *clipping_warnings(grad),
        *warmup_warnings(dims, data.trainer, arms, data.horizon),
        *budget_warns,
        *comparison_warnings(cmp, arms, study.id),
    ]
    regs = regularizers(dims)
    return {
        "study_id": study.id,
        "name": study.name,
        "objective": {"metric": study.metric, "mode": study.mode},
        "trial_counts": _counts(trials),
        "infeasible_fraction": infeasible["fraction"],
        "arms": arms,
        "comparison": cmp,
        "trial_variance": trial_variance(arms, float(np.median(list(noise.values()))) if noise else None),
        "warnings": warnings,
        "skipped": skipped,
        "caveats": caveats(dims, data.trainer)
        + _regularizer_caveat(regs[0].name if regs else None)
        + stopped_short_caveat(short)
        + resumed_caveats(arms, data.resumed, data.trainer),
        "overfitting": screen,
        "max_train_steps": steps,
        "grad_clip": grad,
        "boundary": [c.as_dict() for c in boundary],
        "infeasible": infeasible,
        "curves": curves,
        "budget": budget,
        "stopped_short": short,
        "isolation": isolation_series(dims, trials, arms, sign),
    }


def budgets(
    trials: Sequence[TrialSummary],
    arms: Sequence[Mapping[str, Any]],
    sign: float,
    metric: str,
    noise: Mapping[str, float] | None = None,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The Figure 3 bootstrap per arm over its original finished trials (replicas left out), and a
    `too_few_trials` warning naming the arms whose expected best has not flattened. A gain below
    the arm's noise floor counts as flat: its replica spread where replicas exist, else `noise`
    (by arm key: the evaluation noise of its best curves), since more trials then only pick
    luckier evaluations."""
    out, unflat = [], []
    for arm in arms:
        values = [
            t.objective if t.feasible else None
            for t in trials
            if t.replica_of is None and dict(t.arm) == arm["arm"] and (t.feasible or t.infeasible)
        ]
        if not values:
            continue
        curve = best_of_k(values, sign)  # infeasible trials (diverged included) never win a draw
        floor = arm["replica_std"] if arm["replica_std"] is not None else (noise or {}).get(arm_key(arm["arm"]))
        flat, facts = flattened(curve, sign, noise=floor)
        out.append({"arm": arm["arm"], "label": arm["label"], **curve.as_dict(), "flattened": flat, **facts})
        if not flat and "gain_last_half" in facts:  # fewer trials abstain (`skipped`)
            unflat.append((arm, facts))
    return out, _too_few(unflat, len(arms), metric)


def noise_floors(arms: Sequence[Mapping[str, Any]], noise: Mapping[str, float]) -> dict[str, float]:
    """Per arm key, the noise a difference between its trials must clear: the replica spread of
    its best trial where measured (trial variance), else the evaluation noise of its best curves
    (a lower bound on it)."""
    out = {}
    for arm in arms:
        key = arm_key(arm["arm"])
        floor = arm["replica_std"] if arm["replica_std"] is not None else noise.get(key)
        if floor is not None:
            out[key] = float(floor)
    return out


def late_noise_by_arm(trials: Sequence[TrialSummary], stats: queries.CurveStats | None) -> dict[str, float]:
    """Per arm key, the median over its feasible original trials of the objective's late noise
    (the spread of its last quarter around a line, from the curve statistics): every trial
    measures it, so it is far steadier than the noise of the best few curves alone."""
    if stats is None or not len(stats.trial_ids):
        return {}
    noise = dict(zip(stats.trial_ids.tolist(), stats.late_noise.tolist(), strict=True))
    per_arm: dict[str, list[float]] = {}
    for t in trials:
        value = noise.get(t.id)
        if t.feasible and t.replica_of is None and value is not None and math.isfinite(value):
            per_arm.setdefault(t.arm_key, []).append(value)
    return {key: float(np.median(values)) for key, values in per_arm.items()}


def outlier_warnings(trials: Sequence[TrialSummary], metric: str) -> list[dict[str, Any]]:
    """`outlier_evaluation` for each trial whose best evaluation was set aside as a lone outlier
    (outliers.py): it is not the trial's best, and the person should look at that evaluation."""
    out = []
    for t in trials:
        if t.outlier is not None and t.replica_of is None:
            message = (
                f"Trial {t.id}: {t.outlier} of {metric}, a lone outlier, so it is not taken as the trial's best (now "
                f"{fmt(t.objective)} at step {fmt(t.best_step)}). Check that evaluation (a partial validation set, a "
                "logging or evaluation bug) before trusting single evaluations of this study."
            )
            out.append(warning("outlier_evaluation", message, trial_id=t.id))
    return out


def evaluation_noise(data: StudyData) -> dict[str, float]:
    """Per arm key, the median late step-to-step noise of its best trials' objective curves."""
    return noise_of(data.trials, data.ranks, data.curves, data.study.metric)


def noise_of(
    trials: Sequence[TrialSummary], ranks: Mapping[int, int], curves: Mapping[int, Mapping[str, Curve]], metric: str
) -> dict[str, float]:
    """`evaluation_noise` from its parts (the budget plot loads only these)."""
    per_arm: dict[str, list[float]] = {}
    by_id = {t.id: t for t in trials}
    for trial_id in ranks:
        curve = curves.get(trial_id, {}).get(metric)
        if curve is not None and trial_id in by_id:
            per_arm.setdefault(by_id[trial_id].arm_key, []).append(late_noise(curve))
    return {key: float(np.median(values)) for key, values in per_arm.items()}


def _too_few(unflat: list[tuple[Mapping[str, Any], dict[str, Any]]], n_arms: int, metric: str) -> list[dict[str, Any]]:
    if not unflat:
        return []
    where = (" in arm " + "; ".join(a["label"] for a, _ in unflat)) if n_arms > 1 else ""
    _, facts = unflat[0]
    if "gain_last_half" in facts:
        detail = (
            f"doubling the trials from {facts['n'] // 2} to {facts['n']} still improves the expected best {metric} by "
            f"{fmt(facts['gain_last_half'])}, {facts['gain_last_half'] / max(facts['gain_total'], 1e-300):.0%} of what "
            "tuning gained over a single trial"
        )
    else:
        detail = f"only {facts['n']} finished trials, too few to tell"
    message = (
        f"The tuning budget has not flattened{where}: {detail} (playbook Figure 3). The study may not have sampled "
        "enough points: add trials (PATCH num_trials), or search a smaller space."
    )
    return [warning("too_few_trials", message)]


def _ranked(data: StudyData, arms: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    by_id = {t.id: t for t in data.trials}
    labels = {a["label"]: a for a in arms}
    entries = []
    for trial_id, rank in sorted(data.ranks.items(), key=lambda kv: kv[1]):
        t = by_id.get(trial_id)
        if t is None:
            continue
        label = next((lbl for lbl, a in labels.items() if a["arm"] == dict(t.arm)), "")
        entries.append(
            {
                "trial_id": t.id,
                "number": t.number,
                "arm": dict(t.arm),
                "label": label,
                "rank": rank,
                "best_value": t.objective,
                "best_step": t.best_step,
            }
        )
    return entries


def horizon_of(session: Session, study: queries.StudyInfo) -> float | None:
    """max_train_steps from the spec's trainer settings, else the last step any trial reported."""
    return queries.horizon(session, study)


def _counts(trials: Sequence[TrialSummary]) -> dict[str, int]:
    counts = dict.fromkeys(("pending", "running", "completed", "infeasible", "failed", "cancelled"), 0)
    for t in trials:
        counts[t.status] = counts.get(t.status, 0) + 1
    return counts


def resumed_caveats(
    arms: Sequence[Mapping[str, Any]], resumed: Mapping[int, int], trainer: Mapping[str, Any]
) -> list[dict[str, Any]]:
    """One caveat per arm whose best trial reached its best value in an attempt resumed from a
    checkpoint (docs/analysis.md, "Values from resumed attempts"). A command's resume may not be
    exact (a script that re-seeds its data order ends elsewhere than an uninterrupted run), so the
    caveat suggests a replica of it; the built-in trainer restores model, optimizer, data order and
    random state, so its caveat says the value is the one an uninterrupted run gives."""
    out = []
    for arm in arms:
        tid = arm["best_trial_id"]
        if tid is None or tid not in resumed:
            continue
        what = (
            f"Arm {arm['label']}: its best trial {tid} reached its best value ({fmt(arm['best_value'])} at step "
            f"{fmt(arm['best_step'])}) in an attempt resumed from the checkpoint at step {fmt(resumed[tid])}."
        )
        advice = " " + resume_advice(trainer, tid)
        out.append({"param": None, "value": None, "when": None, "message": what + advice, "trial_id": tid})
    return out


def resume_advice(trainer: Mapping[str, Any], trial_id: int) -> str:
    """What a value from a resumed attempt of trial `trial_id` is worth under `trainer`: exact for
    the built-in trainer; for a command, a replica to run before trusting it (the caveat above and
    the trial page say the same)."""
    if trainer.get("command"):
        return (
            "A script's resume may not be exact (data order and random state re-seeded), so the value may differ "
            f"from an uninterrupted run's: replicate the trial (POST /api/v1/trials/{trial_id}/replicas "
            '{"count": 3}) before trusting it.'
        )
    return (
        "The built-in trainer resumes exactly (model, optimizer, data order and random state restored), so "
        "the value is the one an uninterrupted run gives."
    )


def _regularizer_caveat(regularizer: str | None) -> list[dict[str, Any]]:
    if regularizer is None:
        return []
    message = (
        f"The scientific hyperparameter {regularizer} is a regularizer: overfitting at its low-strength settings (the "
        "lower half of its range, or off) is expected, so there it is reported per trial but not warned about."
    )
    return [{"param": regularizer, "value": None, "when": None, "message": message}]


def json_safe(value: Any) -> Any:
    """Non-finite floats become None and numpy scalars plain numbers, so the answer is valid JSON."""
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
