"""Search-space boundary checks.

Playbook, "Identifying bad search space boundaries": a search space is suspicious if the best point
sampled from it is close to its boundary; if the best points cluster towards the edge of a
dimension, widen it until the best observed point is no longer close to the boundary.

A check is one (declaration, arm) pair, over that arm's feasible trials (replicas left out), in the
space of the declaration's scale. It flags a side when the best trial sits in the outer `band` of
the range on that side and either
- "trend": the objective improves steadily towards that side (Spearman's rank correlation between
  position and objective is significant one-sided at `alpha`), or
- "cluster": the best few trials (the best `TOP_FEW`) all sit in the outer `CLUSTER_BAND` on that
  side, whatever the rest of the range does. This catches an optimum at the edge shaped as a cliff
  (flat elsewhere), which has no trend across the range.
A hyperparameter that does not matter puts its best trial near an edge by chance, but rarely its
best two in the same narrow band, and rarely with a trend; an optimum inside the range puts them
inside. docs/analysis.md gives the detection and false-alarm rates measured over Halton designs
(bench/boundary_power.py).

Either way the edge must beat the rest of the range by more than the noise: the best trial outside
the outer `BAND` must be worse than the best one by more than `NOISE_GAP` times the arm's measured
noise (its replica spread, else the median late noise of its trials' curves). A gap the noise explains
is no reason to widen a range (a hundredfold, for a log-scaled weight decay)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from scipy import stats

from hpo.server.analysis.model import TrialSummary, arm_label, fmt, warning
from hpo.server.space.ranges import widened
from hpo.server.space.search_space import Dimension, unit

BAND = 0.15
ALPHA = 0.01
MIN_TRIALS = 6
# "Cluster": the best TOP_HIT of the TOP_FEW best trials all in the outer CLUSTER_BAND on one side.
# Narrower than BAND and strict, because a hyperparameter that does not matter puts two of the
# best trials in one outer band by chance (2 x 0.1^2 = 2% per side, against 6% with 2 of the top 3 in 15%).
TOP_FEW, TOP_HIT, CLUSTER_BAND = 2, 2, 0.10
# The edge's gain over the best trial elsewhere must exceed this many noise levels: the difference
# of two single runs has a standard deviation of sqrt(2) noise levels.
NOISE_GAP = math.sqrt(2.0)


@dataclass(frozen=True)
class BoundaryCheck:
    """The outcome of one check; `side` is None when the range looks wide enough."""

    dim: Dimension
    arm: dict[str, Any]
    n: int
    best_trial_id: int
    best_value: Any
    best_unit: float
    rho: float
    p_value: float
    side: str | None
    suggested: Any = None
    rule: str | None = None  # "trend" or "cluster" when flagged
    top_in_band: int = 0
    gap: float | None = None  # how much the edge beats the best trial elsewhere (oriented)
    noise: float | None = None  # the noise the gap was held against
    within_noise: bool = False  # the edge would be flagged, but its gap is within the noise

    def as_dict(self) -> dict[str, Any]:
        return {
            "param": self.dim.name,
            "label": self.dim.label,
            "arm": self.arm,
            "n": self.n,
            "best_trial_id": self.best_trial_id,
            "best_value": self.best_value,
            "best_position": round(self.best_unit, 4),
            "rho": round(self.rho, 4),
            "p_value": float(f"{self.p_value:.3g}"),
            "side": self.side,
            "rule": self.rule,
            "top_in_band": self.top_in_band,
            "gap": self.gap,
            "noise": self.noise,
            "within_noise": self.within_noise,
            "range": [self.dim.min, self.dim.max] if self.dim.type != "discrete" else list(self.dim.values),
            "scale": self.dim.scale,
            "suggested": self.suggested,
        }


def check_boundaries(
    dims: Sequence[Dimension],
    trials: Sequence[TrialSummary],
    sign: float,
    *,
    band: float = BAND,
    alpha: float = ALPHA,
    noise: Mapping[str, float] | None = None,
) -> list[BoundaryCheck]:
    """One check per ordered, varied declaration and arm it applies to, with at least
    `MIN_TRIALS` feasible trials. `sign` is +1 when lower objective is better, -1 otherwise;
    `noise` (by arm key) is each arm's measured noise, the floor of an edge's gap."""
    by_arm: dict[str, list[TrialSummary]] = {}
    for t in trials:
        if t.feasible and t.replica_of is None:
            by_arm.setdefault(t.arm_key, []).append(t)
    checks = []
    for arm_trials in by_arm.values():
        arm = dict(arm_trials[0].arm)
        for dim in dims:
            if dim.varied and dim.ordered and dim.applies(arm):
                check = _check_one(dim, arm, arm_trials, sign, band, alpha)
                if check is not None and check.side is not None:
                    check = _against_noise(check, arm_trials, sign, band, (noise or {}).get(arm_trials[0].arm_key))
                if check is not None:
                    checks.append(check)
    return checks


def _check_one(
    dim: Dimension, arm: dict[str, Any], trials: Sequence[TrialSummary], sign: float, band: float, alpha: float
) -> BoundaryCheck | None:
    points = [(unit(dim, t.params.get(dim.name)), sign * float(t.objective or 0.0), t) for t in trials]
    usable = [(u, y, t) for u, y, t in points if u is not None and dim.name in t.params]
    if len(usable) < MIN_TRIALS:
        return None
    u = np.array([p[0] for p in usable])
    y = np.array([p[1] for p in usable])
    if np.ptp(u) == 0 or np.ptp(y) == 0:
        return None
    rho, p_two = stats.spearmanr(u, y)
    rho, p_one = float(rho), float(p_two) / 2
    order = np.argsort(y, kind="stable")
    best = int(order[0])
    top = u[order[:TOP_FEW]]
    side, rule, hits = None, None, 0
    for name, at_edge, in_band, trend in (
        ("max", u[best] >= 1 - band, top >= 1 - CLUSTER_BAND, rho < 0),
        ("min", u[best] <= band, top <= CLUSTER_BAND, rho > 0),
    ):
        if not at_edge:
            continue
        hits = int(in_band.sum())
        if trend and p_one < alpha:
            side, rule = name, "trend"
        elif hits >= TOP_HIT:
            side, rule = name, "cluster"
    best_trial = usable[best][2]
    return BoundaryCheck(
        dim=dim,
        arm=arm,
        n=len(usable),
        best_trial_id=best_trial.id,
        best_value=best_trial.params[dim.name],
        best_unit=float(u[best]),
        rho=rho,
        p_value=p_one,
        side=side,
        suggested=widened(dim, side) if side else None,
        rule=rule,
        top_in_band=hits,
    )


def _against_noise(
    check: BoundaryCheck, trials: Sequence[TrialSummary], sign: float, band: float, noise: float | None
) -> BoundaryCheck:
    """The check with its gap measured, unflagged when the gap is within `NOISE_GAP` noise levels."""
    dim, side = check.dim, check.side
    elsewhere = [
        sign * float(t.objective or 0.0)
        for t in trials
        if (u := unit(dim, t.params.get(dim.name))) is not None and (u < 1 - band if side == "max" else u > band)
    ]
    best = min(sign * float(t.objective or 0.0) for t in trials)
    gap = min(elsewhere) - best if elsewhere else None
    if gap is None or noise is None or not noise > 0 or gap > NOISE_GAP * noise:
        return replace(check, gap=gap, noise=noise)
    return replace(check, gap=gap, noise=noise, side=None, suggested=None, rule=None, within_noise=True)


def boundary_warnings(checks: Sequence[BoundaryCheck], n_arms: int) -> list[dict[str, Any]]:
    """One `boundary` warning per declaration and side, naming the arms where it holds."""
    grouped: dict[tuple[str, str], list[BoundaryCheck]] = {}
    for check in checks:
        if check.side is not None:
            grouped.setdefault((check.dim.label, check.side), []).append(check)
    return [_warning(group, n_arms) for group in grouped.values()]


def _warning(group: list[BoundaryCheck], n_arms: int) -> dict[str, Any]:
    first = group[0]
    dim, side = first.dim, first.side or "max"
    where = ""
    if n_arms > 1:
        where = " in arm " + "; ".join(arm_label(c.arm) for c in group)
    searched = (
        f"[{fmt(dim.min)}, {fmt(dim.max)}] ({dim.scale} scale)"
        if dim.type != "discrete"
        else "[" + ", ".join(map(fmt, dim.values)) + "]"
    )
    best = ", ".join(fmt(c.best_value) for c in group)
    why = (
        f"the objective improves towards that edge, Spearman rho = {first.rho:.2f} over {first.n} trials"
        if first.rule == "trend"
        else f"the {first.top_in_band} best trials all lie in the outer {CLUSTER_BAND:.0%} of the range"
    )
    if first.suggested is None:
        action = f"The range cannot be widened on that side; consider reparameterizing {dim.name}."
    elif dim.type == "discrete":
        action = f"Add {fmt(first.suggested)} to its values and run another study."
    else:
        action = f"Widen the range: try {side} = {fmt(first.suggested)} and run another study."
    message = (
        f"{dim.label}: the best trials{where} sit at the {side} edge of the searched range {searched} "
        f"(best at {best}; {why}), so a better point may lie outside it. {action}"
    )
    return warning("boundary", message, param=dim.name, side=side)
