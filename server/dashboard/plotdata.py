"""What each plot needs, loaded with the analysis' own queries and checks (playbook, "Automate
generically useful plots": axis plots for every varied hyperparameter, training curves of the
best trials, and more). Each kind loads only its own data, so a plot never waits on the rest."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from hpo.server.analysis import load
from hpo.server.analysis.aliases import aliases_of, filed, metric_name, missing_metric
from hpo.server.analysis.judged import load_trials
from hpo.server.analysis.model import TrialSummary
from hpo.server.analysis.rules.arms import arm_summaries
from hpo.server.analysis.rules.boundary import check_boundaries
from hpo.server.analysis.rules.curves import OBJECTIVE_TRAIN
from hpo.server.analysis.rules.divergence import best_ranks
from hpo.server.analysis.rules.isolation import isolation_series
from hpo.server.analysis.rules.stopped import concluding, stopped_short
from hpo.server.analysis.rules.training import best_step_summary
from hpo.server.analysis.service import (
    BEST_FEW,
    GRAD_NORM,
    best_curves,
    budgets,
    horizon_of,
    late_noise_by_arm,
    noise_floors,
    noise_of,
)
from hpo.server.db import Database
from hpo.server.errors import NotFound
from hpo.server.models import Checkpoint, Trial
from hpo.server.space.search_space import dimensions

PLOT_KINDS = ("axis", "isolation", "curves", "grad_norm", "best_steps", "budget")
CURVE_EXTRA = ("valid/loss",)


def plot_data(db: Database, study_id: int, kind: str, trial_id: int | None = None) -> dict[str, Any]:
    """The plain data `plots.render(kind, ...)` draws. `trial_id` narrows `curves` and `grad_norm`
    to one trial of the study. Raises `NotFound` for an unknown study or a trial not in it."""
    with db.transaction() as session:
        study = load.study_info(session, study_id)
        base: dict[str, Any] = {"study": study.name, "metric": study.metric, "mode": study.mode}
        return {**base, **_LOADERS[kind](session, study, trial_id)}


def _axis(session: Session, study: load.StudyInfo, _trial_id: int | None) -> dict[str, Any]:
    trials, stats = load_trials(session, study)  # diverged trials drawn as red crosses
    dims = dimensions(study.spec)
    sign = 1.0 if study.mode == "min" else -1.0
    floors = noise_floors(arm_summaries(trials, sign), late_noise_by_arm(trials, stats.get(study.metric)))
    judged = _concluding(study, trials)
    flagged = {(c.dim.label, c.side) for c in check_boundaries(dims, judged, sign, noise=floors) if c.side}
    return {"dims": [d for d in dims if d.varied], "trials": trials, "flagged": flagged}


def _isolation(session: Session, study: load.StudyInfo, _trial_id: int | None) -> dict[str, Any]:
    trials, _ = load_trials(session, study)
    sign = 1.0 if study.mode == "min" else -1.0
    arms = arm_summaries(trials, sign)
    return {"series": isolation_series(dimensions(study.spec), trials, arms, sign), "arms": arms}


def _curves(session: Session, study: load.StudyInfo, trial_id: int | None) -> dict[str, Any]:
    train = metric_name(aliases_of(study.spec), OBJECTIVE_TRAIN)  # a script's own name, filed under hpo's
    names = sorted({study.metric, train, *CURVE_EXTRA})
    if trial_id is not None:
        _ensure_in_study(session, study.id, trial_id)
        entries: list[dict[str, Any]] = [{"trial_id": trial_id, "label": f"trial {trial_id}", "rank": 1}]
        curves = load.curves_of(session, [trial_id], names)
    else:
        summaries, _ = load_trials(session, study)  # the analysis' best few: never a diverged trial
        ranks = best_ranks(summaries, 1.0 if study.mode == "min" else -1.0, BEST_FEW)
        curves = load.curves_of(session, sorted(ranks), names)  # drawn as stored, outliers included
        trials = {t.id: t for t in summaries}
        entries = [
            {"trial_id": tid, "label": _arm_text(trials[tid].arm, tid, rank), "rank": rank}
            for tid, rank in sorted(ranks.items(), key=lambda kv: (kv[1], kv[0]))
        ]
    ids = [int(e["trial_id"]) for e in entries]
    if train != OBJECTIVE_TRAIN:
        curves = {tid: filed(series, train, OBJECTIVE_TRAIN) for tid, series in curves.items()}
    return {"entries": entries, "curves": curves, "checkpoints": _checkpoints(session, ids)}


def _grad_norm(session: Session, study: load.StudyInfo, trial_id: int | None) -> dict[str, Any]:
    if trial_id is not None:
        _ensure_in_study(session, study.id, trial_id)
        entries: list[dict[str, Any]] = [{"trial_id": trial_id, "label": f"trial {trial_id}"}]
    else:
        sign = 1.0 if study.mode == "min" else -1.0
        arms = arm_summaries(load_trials(session, study)[0], sign)
        entries = [{"trial_id": a["best_trial_id"], "label": a["label"]} for a in arms if a["best_trial_id"]]
    ids = [int(e["trial_id"]) for e in entries]
    aliases = aliases_of(study.spec)
    name = metric_name(aliases, GRAD_NORM)  # the script's own name where aliased
    stats = {row["trial_id"]: row for row in load.grad_norm_stats(session, ids, metric=name)}
    curves = load.curves_of(session, ids, [name])
    for e in entries:
        e["p90"] = stats.get(e["trial_id"], {}).get("p90")
        e["curve"] = curves.get(int(e["trial_id"]), {}).get(name)
    # Trials that reported, none of them this metric: the study does not have it (say so, in words).
    none = entries and all(e["curve"] is None for e in entries)
    missing = missing_metric(aliases, GRAD_NORM) if none else None
    return {"entries": entries, "grad_metric": name, "missing": missing}


def _best_steps(session: Session, study: load.StudyInfo, _trial_id: int | None) -> dict[str, Any]:
    sign = 1.0 if study.mode == "min" else -1.0
    trials, stats = load_trials(session, study)
    judged = _concluding(study, trials)
    return {"summary": best_step_summary(judged, sign, horizon_of(session, study), stats.get(study.metric))}


def _budget(session: Session, study: load.StudyInfo, _trial_id: int | None) -> dict[str, Any]:
    trials, _ = load_trials(session, study)  # diverged trials never win a draw
    sign = 1.0 if study.mode == "min" else -1.0
    ranks, curves = best_curves(session, trials, study.metric, sign, BEST_FEW)
    arms = arm_summaries(trials, sign)
    judged = _concluding(study, trials)
    series, _ = budgets(judged, arms, sign, study.metric, noise_of(trials, ranks, curves, study.metric))
    return {"series": series}


def _concluding(study: load.StudyInfo, trials: list[TrialSummary]) -> list[TrialSummary]:
    """The trials the analysis draws its conclusions from (those that stopped short left out)."""
    settings = dict(study.spec.get("trainer") or {})
    return concluding(trials, stopped_short(trials, settings))


def _checkpoints(session: Session, trial_ids: list[int]) -> dict[int, list[int]]:
    if not trial_ids:
        return {}
    rows = session.execute(
        select(Checkpoint.trial_id, Checkpoint.step).where(Checkpoint.trial_id.in_(trial_ids)).order_by(Checkpoint.step)
    ).all()
    out: dict[int, list[int]] = {}
    for tid, step in rows:
        out.setdefault(tid, []).append(step)
    return out


def _ensure_in_study(session: Session, study_id: int, trial_id: int) -> None:
    if session.scalar(select(Trial.id).where(Trial.id == trial_id, Trial.study_id == study_id)) is None:
        raise NotFound(f"trial {trial_id} not found in study {study_id}")


def _arm_text(arm: Any, trial_id: int, rank: int) -> str:
    name = ", ".join(f"{k}={v}" for k, v in sorted(dict(arm).items()))
    return f"{name + ' ' if name else ''}#{rank} (trial {trial_id})"


_LOADERS: dict[str, Callable[[Session, load.StudyInfo, int | None], dict[str, Any]]] = {
    "axis": _axis,
    "isolation": _isolation,
    "curves": _curves,
    "grad_norm": _grad_norm,
    "best_steps": _best_steps,
    "budget": _budget,
}
