"""Isolation plot data (playbook, "Detecting whether a change is useful with isolation plots"):
the best trial over the nuisance hyperparameters for each value of a scientific hyperparameter.
Crossed (categorical or discrete) scientific values are the arms; a continuous scientific
hyperparameter is bucketed along its scale and the best trial of each bucket taken, as the playbook
suggests for quasi-random data.

A bucket series is drawn on the parameter's own scale (`scale`: a log-scaled weight decay on a log
axis, buckets equally wide in log space, centred at their geometric middle). Each bucket carries
its uncertainty: the 5% and 95% quantiles (`lo`, `hi`) of the best value of its n trials resampled
n times with replacement (the exact bootstrap of budget.py), so a bucket won by one lucky trial
among few shows a wide interval, and `std`, the replica spread of its best trial where measured."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from hpo.server.analysis.model import TrialSummary, arm_label
from hpo.server.analysis.rules.arms import replica_stats
from hpo.server.analysis.rules.budget import best_of_k
from hpo.server.space.search_space import Dimension, from_unit, unit

MAX_BUCKETS = 8


def isolation_series(
    dims: Sequence[Dimension], trials: Sequence[TrialSummary], arms: Sequence[Mapping[str, Any]], sign: float
) -> list[dict[str, Any]]:
    """`[{param, kind: "arms"|"buckets", arm?, points: [{x, best_value, trial_id, std, n}]}]`."""
    series = []
    if len(arms) > 1 or any(a["arm"] for a in arms):
        crossed = sorted({k for a in arms for k in a["arm"]})
        ordered = [d for d in dims if d.name in crossed and d.role == "scientific" and d.ordered]
        points = [
            {
                "x": a["label"],
                "best_value": a["best_value"],
                "trial_id": a["best_trial_id"],
                "std": a["replica_std"],
                "n": a["n_trials"],
            }
            for a in sorted(arms, key=lambda a: _position(dims, crossed, a["arm"]))
        ]
        # A single ordered scientific hyperparameter (depth 2, 4, 8) is drawn along its values, so a
        # U-shaped response shows as one (playbook, "Detecting whether a change is useful with
        # isolation plots"); the arms' rank order would hide it.
        series.append(
            {
                "param": ", ".join(crossed),
                "kind": "arms",
                "ordered": len(crossed) == 1 and len(ordered) == 1,
                "points": points,
            }
        )
    for dim in dims:
        if dim.role == "scientific" and dim.varied and dim.type in ("float", "int"):
            for arm in arms:
                if dim.applies(arm["arm"]):
                    series.append(_buckets(dim, arm["arm"], trials, sign))
    return series


def _position(dims: Sequence[Dimension], names: Sequence[str], arm: Mapping[str, Any]) -> tuple[Any, ...]:
    """An arm's place in the declared values of its scientific hyperparameters (numeric values of a
    discrete one by value), never its rank."""
    key: list[Any] = []
    for name in names:
        dim = next((d for d in dims if d.name == name and d.values), None)
        value = arm.get(name)
        if dim is None or value not in dim.values:
            key.append((1, str(value)))
        elif dim.type == "discrete" and all(isinstance(v, (int, float)) for v in dim.values):
            key.append((0, float(value)))  # type: ignore[arg-type]  # a declared numeric value
        else:
            key.append((0, list(dim.values).index(value)))
    return tuple(key)


def _buckets(dim: Dimension, arm: Mapping[str, Any], trials: Sequence[TrialSummary], sign: float) -> dict[str, Any]:
    key_trials = [
        t for t in trials if (t.feasible or t.infeasible) and t.replica_of is None and dict(t.arm) == dict(arm)
    ]
    placed: list[tuple[float, TrialSummary]] = []
    for t in key_trials:
        u = unit(dim, t.params.get(dim.name))
        if u is not None:
            placed.append((u, t))
    n_buckets = max(1, min(MAX_BUCKETS, len(placed) // 3))
    members: dict[int, list[TrialSummary]] = {}
    for u, t in placed:
        b = min(n_buckets - 1, max(0, math.floor(u * n_buckets)))
        members.setdefault(b, []).append(t)
    replicas: dict[int, list[TrialSummary]] = {}
    for t in trials:
        if t.replica_of is not None:
            replicas.setdefault(t.replica_of, []).append(t)
    points = []
    for b in sorted(members):
        group = members[b]
        feasible = [t for t in group if t.feasible]
        if not feasible:
            continue
        best = min(feasible, key=lambda t: sign * (t.objective or 0.0))
        # infeasible members take part in the resampling and never win a draw
        spread = best_of_k([t.objective if t.feasible else None for t in group], sign, ks=[len(group)]).as_dict()
        points.append(
            {
                "x": from_unit(dim, (b + 0.5) / n_buckets),
                "x_lo": from_unit(dim, b / n_buckets),
                "x_hi": from_unit(dim, (b + 1) / n_buckets),
                "best_value": best.objective,
                "trial_id": best.id,
                "lo": spread["p5"][0],
                "hi": spread["p95"][0],
                "std": replica_stats(replicas.get(best.id, []))["replica_std"],
                "n": len(group),
            }
        )
    return {
        "param": dim.name,
        "kind": "buckets",
        "scale": dim.scale,
        "arm": dict(arm),
        "label": arm_label(arm),
        "points": points,
    }
