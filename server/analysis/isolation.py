"""Isolation plot data (playbook, "Detecting whether a change is useful with isolation plots"):
the best trial over the nuisance hyperparameters for each value of a scientific hyperparameter.
Crossed (categorical or discrete) scientific values are the arms; a continuous scientific
hyperparameter is bucketed along its scale and the best trial of each bucket taken, as the playbook
suggests for quasi-random data."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from .model import TrialSummary, arm_label
from .space import Dimension, from_unit, unit

MAX_BUCKETS = 8


def isolation_series(
    dims: Sequence[Dimension], trials: Sequence[TrialSummary], arms: Sequence[Mapping[str, Any]], sign: float
) -> list[dict[str, Any]]:
    """`[{param, kind: "arms"|"buckets", arm?, points: [{x, best_value, trial_id, std, n}]}]`."""
    series = []
    if len(arms) > 1 or any(a["arm"] for a in arms):
        points = [
            {
                "x": a["label"],
                "best_value": a["best_value"],
                "trial_id": a["best_trial_id"],
                "std": a["replica_std"],
                "n": a["n_trials"],
            }
            for a in arms
        ]
        series.append(
            {"param": ", ".join(sorted({k for a in arms for k in a["arm"]})), "kind": "arms", "points": points}
        )
    for dim in dims:
        if dim.role == "scientific" and dim.varied and dim.type in ("float", "int"):
            for arm in arms:
                if dim.applies(arm["arm"]):
                    series.append(_buckets(dim, arm["arm"], trials, sign))
    return series


def _buckets(dim: Dimension, arm: Mapping[str, Any], trials: Sequence[TrialSummary], sign: float) -> dict[str, Any]:
    key_trials = [t for t in trials if t.feasible and t.replica_of is None and dict(t.arm) == dict(arm)]
    placed: list[tuple[float, TrialSummary]] = []
    for t in key_trials:
        u = unit(dim, t.params.get(dim.name))
        if u is not None:
            placed.append((u, t))
    n_buckets = max(1, min(MAX_BUCKETS, len(placed) // 3))
    best: dict[int, TrialSummary] = {}
    counts: dict[int, int] = {}
    for u, t in placed:
        b = min(n_buckets - 1, max(0, math.floor(u * n_buckets)))
        counts[b] = counts.get(b, 0) + 1
        if b not in best or sign * (t.objective or 0.0) < sign * (best[b].objective or 0.0):
            best[b] = t
    points = [
        {
            "x": from_unit(dim, (b + 0.5) / n_buckets),
            "best_value": best[b].objective,
            "trial_id": best[b].id,
            "std": None,
            "n": counts[b],
        }
        for b in sorted(best)
    ]
    return {"param": dim.name, "kind": "buckets", "arm": dict(arm), "label": arm_label(arm), "points": points}
