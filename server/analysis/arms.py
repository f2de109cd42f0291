"""The best trial per arm with the nuisance hyperparameters optimized away, retrain variance from
replicas, and whether arms differ by more than that variance.

Playbook, "Detecting whether a change is useful with isolation plots": each point is the best trial
over the nuisance hyperparameters for one setting of the scientific ones. "Determining whether to
adopt a training pipeline change": run the best trial N times to characterize the run-to-run trial
variance, and adopt a change only when it beats the baseline taking that variance into account."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from .model import TrialSummary, arm_label, fmt, warning


def arm_summaries(trials: Sequence[TrialSummary], sign: float) -> list[dict[str, Any]]:
    """One entry per arm, best arm first: its best trial among the original (non-replica) trials,
    counts, and the replicas of that best trial (`n_replicas` finished ones, `replica_std` and
    `replica_mean` over the best trial and its replicas when there are at least two values)."""
    groups: dict[str, list[TrialSummary]] = {}
    for t in trials:
        groups.setdefault(t.arm_key, []).append(t)
    summaries = [_summary(group, trials, sign) for group in groups.values()]
    return sorted(summaries, key=lambda a: (a["best_value"] is None, sign * (a["best_value"] or 0.0), a["label"]))


def _summary(group: list[TrialSummary], trials: Sequence[TrialSummary], sign: float) -> dict[str, Any]:
    originals = [t for t in group if t.replica_of is None]
    feasible = [t for t in originals if t.feasible]
    best = min(feasible, key=lambda t: (sign * (t.objective or 0.0), t.number)) if feasible else None
    counts = {s: sum(t.status == s for t in originals) for s in ("completed", "running", "pending", "failed")}
    replicas = _replica_stats(best, trials)
    return {
        "arm": dict(group[0].arm),
        "label": arm_label(group[0].arm),
        "best_trial_id": best.id if best else None,
        "best_value": best.objective if best else None,
        "best_step": best.best_step if best else None,
        "best_params": dict(best.params) if best else None,
        "n_trials": len(originals),
        "n_completed": counts["completed"],
        "n_infeasible": sum(t.infeasible for t in originals),
        "n_failed": counts["failed"],
        "n_unfinished": counts["running"] + counts["pending"],
        **replicas,
    }


def _replica_stats(best: TrialSummary | None, trials: Sequence[TrialSummary]) -> dict[str, Any]:
    if best is None:
        return {
            "n_replicas": 0,
            "n_replicas_infeasible": 0,
            "replica_std": None,
            "replica_mean": None,
            "replica_values": [],
        }
    reps = [t for t in trials if t.replica_of == best.id]
    values = [float(best.objective or 0.0)] + [float(t.objective or 0.0) for t in reps if t.feasible]
    std = float(np.std(values, ddof=1)) if len(values) >= 2 else None
    return {
        "n_replicas": len(values) - 1,
        "n_replicas_infeasible": sum(t.infeasible for t in reps),
        "replica_std": std,
        "replica_mean": float(np.mean(values)) if len(values) >= 2 else None,
        "replica_values": values,
    }


def within_noise_warnings(arms: Sequence[dict[str, Any]], sign: float) -> list[dict[str, Any]]:
    """`within_noise` for each arm whose replica mean trails the best arm's by less than the
    spread of a difference of two single runs, sqrt(std_a^2 + std_b^2); needs replicas in both."""
    measured = [a for a in arms if a["replica_std"] is not None]
    if len(measured) < 2:
        return []
    leader = min(measured, key=lambda a: sign * a["replica_mean"])
    out = []
    for other in measured:
        if other is leader:
            continue
        gap = abs(leader["replica_mean"] - other["replica_mean"])
        spread = math.hypot(leader["replica_std"], other["replica_std"])
        if gap < spread:
            out.append(warning("within_noise", _noise_message(leader, other, gap, spread)))
    return out


def _noise_message(leader: dict[str, Any], other: dict[str, Any], gap: float, spread: float) -> str:
    return (
        f"Arm {leader['label']} beats arm {other['label']} by {fmt(gap)} on average over their replicas, "
        f"less than the run-to-run spread {fmt(spread)} measured from {leader['n_replicas']} and "
        f"{other['n_replicas']} replicas: the difference may be trial variance. Treat the arms as tied, or "
        "run more replicas (POST /api/v1/trials/{id}/replicas) before adopting the change."
    )
