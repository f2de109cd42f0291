"""Curve findings of the best few trials of each arm, turned into warnings a person can act on,
and the overfitting screen of every finished trial (playbook, "Examining the training curves":
"Even if none of the 'best' trials are exhibiting problematic overfitting, there might still be a
problem if it occurs in any of the trials")."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from hpo.server.analysis.model import Curve, TrialSummary, fmt, warning
from hpo.server.analysis.rules.diagnostics import NEEDS, NOISE_CLEARANCE, Finding, check_curves, overfit_threshold
from hpo.server.space.search_space import Dimension, is_regularizer, unit

if TYPE_CHECKING:  # annotations only: the rules take plain values, never a database
    from hpo.server.analysis.load import CurveStats

OBJECTIVE_TRAIN = "train/loss"


def curve_report(
    ranked: Sequence[Mapping[str, Any]],
    curves: Mapping[int, Mapping[str, Curve]],
    metric: str,
    sign: float,
    horizon: float | None,
    exempt: Collection[int] = (),
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Runs the curve checks on each ranked trial (`{trial_id, arm, label, rank, best_value,
    best_step}`); answers the per-trial reports and the warnings. Overfitting of a trial in
    `exempt` (a low-strength setting of a scientific regularizer, `exempt_trials`) is reported but
    not warned about."""
    reports, warnings = [], []
    for entry in ranked:
        series = curves.get(entry["trial_id"], {})
        objective = series.get(metric)
        findings = (
            []
            if objective is None
            else check_curves(objective, series.get(OBJECTIVE_TRAIN), sign=sign, horizon=horizon)
        )
        report = {**entry, "findings": []}
        for finding in findings:
            suppressed = finding.kind == "overfitting" and entry["trial_id"] in exempt
            report["findings"].append({"kind": finding.kind, "facts": finding.facts, "suppressed": suppressed})
            if not suppressed:
                warnings.append(curve_warning(entry, finding, metric))
        reports.append(report)
    return reports, warnings


def curve_warning(entry: Mapping[str, Any], finding: Finding, metric: str) -> dict[str, Any]:
    """The warning for one finding, naming the trial, its place in its arm and what to do."""
    who = f"Trial {entry['trial_id']} (#{entry['rank']} of arm {entry['label']})"
    facts = finding.facts
    text = _MESSAGES[finding.kind](who, metric, facts)
    return warning(finding.kind, text, trial_id=entry["trial_id"])


def _overfitting(who: str, metric: str, f: Mapping[str, Any]) -> str:
    train = ""
    if "train_end" in f:
        train = f" while {OBJECTIVE_TRAIN} keeps falling ({fmt(f['train_at_best'])} to {fmt(f['train_end'])})"
    moves = "rises" if f["end"] > f["best"] else "falls"
    return (
        f"{who} overfits: {metric} is best at step {fmt(f['best_step'])} ({fmt(f['best'])}) and then {moves} to "
        f"{fmt(f['end'])}{train}. Re-run with more or better-tuned regularization (dropout, weight decay, label "
        "smoothing) before comparing the scientific hyperparameters."
    )


def _high_variance(who: str, metric: str, f: Mapping[str, Any]) -> str:
    return (
        f"{who}: late in training (from step {fmt(f['from_step'])}) {metric} jumps by about {fmt(f['noise'])} between "
        f"evaluations ({f['noise_share']:.0%} of its whole improvement), so its best value depends on a lucky step. "
        "Decay the learning rate, enlarge the batch or the validation set, or use Polyak averaging."
    )


def _still_improving(who: str, metric: str, f: Mapping[str, Any]) -> str:
    return (
        f"{who}: {metric} is still improving at the end of training (by {fmt(f['gain'])} since step "
        f"{fmt(f['from_step'])}). Train longer (raise max_train_steps) or re-tune the learning-rate decay schedule."
    )


def _saturated_early(who: str, metric: str, f: Mapping[str, Any]) -> str:
    return (
        f"{who}: training and validation curves saturate by step {fmt(f['saturated_at'])} ({f['share']:.0%} of "
        "training) and stay flat, so most steps are wasted. Lower max_train_steps and spend the compute on more trials."
    )


def _training_loss_rising(who: str, metric: str, f: Mapping[str, Any]) -> str:
    return (
        f"{who}: {OBJECTIVE_TRAIN} rises from {fmt(f['min'])} at step {fmt(f['min_step'])} to {fmt(f['end'])} at the "
        "end. A rising training loss usually means a bug in the training pipeline (or an instability): check the "
        "data pipeline, the loss and the learning-rate schedule before trusting this study."
    )


_MESSAGES = {
    "overfitting": _overfitting,
    "high_variance": _high_variance,
    "still_improving": _still_improving,
    "saturated_early": _saturated_early,
    "training_loss_rising": _training_loss_rising,
}


# A regularizer's setting counts as low-strength in the lower half of its range (in its scale's
# space), or as the lower half of its ordered values, or when it is off (0, false, "none").
LOW_STRENGTH = 0.5


def regularizers(dims: Sequence[Dimension]) -> list[Dimension]:
    """The scientific hyperparameters that are regularizers (by name, `is_regularizer`)."""
    return [d for d in dims if d.role == "scientific" and is_regularizer(d.name)]


def exempt_trials(dims: Sequence[Dimension], trials: Sequence[TrialSummary]) -> set[int]:
    """Trials whose overfitting is expected, per the playbook's narrower wording: "if the
    scientific hyperparameters include regularization parameters ... it would not be surprising
    if low-strength settings of those regularization parameters resulted in problematic
    overfitting". Only trials at a low-strength setting of a scientific regularizer are exempt;
    the same study's strongly regularized trials are still warned about."""
    regs = regularizers(dims)
    out = set()
    for t in trials:
        for d in regs:
            value = t.params.get(d.name, t.arm.get(d.name))
            if d.applies(t.arm) and _low_strength(d, value):
                out.add(t.id)
    return out


def _low_strength(dim: Dimension, value: Any) -> bool:
    if value is None or value is False or value == 0 or (isinstance(value, str) and value.lower() in ("none", "off")):
        return True
    if dim.type in ("float", "int", "discrete"):
        u = unit(dim, value)
        return u is not None and u <= LOW_STRENGTH
    if dim.type == "categorical" and dim.values:
        return list(dim.values).index(value) < len(dim.values) / 2 if value in dim.values else False
    return False


def overfitting_screen(
    trials: Sequence[TrialSummary],
    objective: CurveStats | None,
    train: CurveStats | None,
    sign: float,
    exempt: Collection[int],
) -> dict[str, Any]:
    """Every finished feasible trial judged from its curve statistics (queries.curve_stats),
    vectorized: it overfits when its end level (a line through its last quarter, at its last step)
    is worse than its best value by more than `overfit_threshold` (the best value's share and the
    late noise: its own, at least the study's median), while its training loss keeps falling (ended
    below where it started, no late rise beyond its noise). Answers `{examined, flagged, trial_ids, exempt_ids}`."""
    by_id = {t.id: t for t in trials if t.feasible and t.objective is not None}
    empty = {"examined": 0, "flagged": 0, "trial_ids": [], "exempt_ids": []}
    if objective is None or not len(objective.trial_ids):
        return empty
    keep = np.array([int(i) in by_id for i in objective.trial_ids], dtype=bool)
    ids = objective.trial_ids[keep]
    if not len(ids):
        return empty
    best = sign * np.array([float(by_id[int(i)].objective) for i in ids])  # type: ignore[arg-type]
    end = sign * objective.end[keep]
    n = objective.n[keep]
    # A trial's late noise comes from a handful of points; the study's median late noise floors it, so
    # a curve that happens to look quiet is not judged against a noise level it does not have.
    own = objective.late_noise[keep]
    sigma = np.maximum(own, float(np.nanmedian(own))) if np.isfinite(own).any() else own
    threshold = overfit_threshold(best, sigma, n)
    with np.errstate(invalid="ignore"):
        flagged = (n >= NEEDS["overfitting"][1]) & (objective.late_n[keep] >= 3) & (end - best > threshold)
    # Only while the training loss keeps falling (playbook: validation worse while training improves):
    # it ended below where it started and its late line does not rise beyond its noise. A trial that
    # logged no training loss is not called overfitting (a rising validation curve may be divergence).
    trained = np.zeros(len(ids), dtype=bool)
    if train is not None and len(train.trial_ids):
        order = {int(t): k for k, t in enumerate(train.trial_ids)}
        at = np.array([order.get(int(i), -1) for i in ids])
        found = at >= 0
        k = at[found]
        with np.errstate(invalid="ignore"):
            falling = (train.end[k] < train.first[k]) & (train.late_change[k] <= NOISE_CLEARANCE * train.late_noise[k])
        trained[found] = np.nan_to_num(falling, nan=0.0).astype(bool)
    flagged &= trained
    hit = [int(i) for i in ids[flagged]]
    return {
        "examined": int(len(ids)),
        "flagged": len(hit),
        "trial_ids": [i for i in hit if i not in exempt],
        "exempt_ids": [i for i in hit if i in exempt],
    }


def screen_warnings(screen: Mapping[str, Any], warned: Collection[int], metric: str) -> list[dict[str, Any]]:
    """One `overfitting` warning (no trial_id) for the flagged trials that are not among the best
    few already warned about individually."""
    others = [i for i in screen["trial_ids"] if i not in warned]
    if not others:
        return []
    shown = ", ".join(map(str, others[:8])) + (", ..." if len(others) > 8 else "")
    message = (
        f"{len(screen['trial_ids'])} of the {screen['examined']} finished trials overfit ({metric} ends well worse "
        f"than its best value), {len(others)} of them beyond the best few (trials {shown}). Selecting the best trial "
        "favours configurations with more regularization, including accidental ones such as a smaller learning rate "
        '(playbook, "Examining the training curves"): add or re-tune regularization before comparing arms.'
    )
    return [warning("overfitting", message)]
