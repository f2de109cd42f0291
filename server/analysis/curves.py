"""Curve findings of the best few trials of each arm, turned into warnings a person can act on
(playbook, "Examining the training curves")."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .diagnostics import Finding, check_curves
from .model import Curve, fmt, warning

OBJECTIVE_TRAIN = "train/loss"


def curve_report(
    ranked: Sequence[Mapping[str, Any]],
    curves: Mapping[int, Mapping[str, Curve]],
    metric: str,
    sign: float,
    horizon: float | None,
    regularizer: str | None,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Runs the curve checks on each ranked trial (`{trial_id, arm, label, rank, best_value,
    best_step}`); answers the per-trial reports and the warnings. With `regularizer` naming a
    scientific hyperparameter that regularizes, overfitting is reported but not warned about
    (playbook: low settings of a regularizer are expected to overfit)."""
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
            suppressed = finding.kind == "overfitting" and regularizer is not None
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
    return (
        f"{who} overfits: {metric} is best at step {fmt(f['best_step'])} ({fmt(f['best'])}) and then rises to "
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
