"""Infeasible trials: how many, why, where in the search space, and whether the best learning rate
sits at the edge of feasibility.

Playbook, "Extracting insight from experimental results": what fraction of the trials are
infeasible (diverge, get really bad loss values, or fail to run)? When it is very large, adjust the
search space to avoid sampling such points. "Identifying unstable workloads" (Figure 7a): a best
learning rate right at the edge of instability suggests fixing the instability (warmup, clipping)
would allow higher learning rates and better results."""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import numpy as np
from scipy import stats

from hpo.server.analysis.model import Curve, TrialSummary, arm_label, fmt, warning
from hpo.server.analysis.rules.diagnostics import loss_rises
from hpo.server.space.search_space import Dimension, is_learning_rate, unit

# A warning above this share of infeasible trials (the playbook says "a very large fraction").
INFEASIBLE_SHARE = 0.2
# Instability: infeasible trials start this close above the best learning rate, in unit range.
NEIGHBOUR_GAP = 0.15


def infeasible_summary(trials: Sequence[TrialSummary], dims: Sequence[Dimension], metric: str) -> dict[str, Any]:
    """`{fraction, count, finished, reasons: [{reason, count}], where, value, trial_ids, diverged}`
    over the original trials: fraction = infeasible / (completed + infeasible); `where` names the
    hyperparameter whose position best separates infeasible from feasible trials (None when none
    does), `value` the value of a categorical or discrete one where they concentrate
    (`value_concentration`); `trial_ids` every trial judged infeasible (replicas included: plots draw them all as red
    crosses), `diverged` `[{trial_id, reason}]` for the completed ones judged from their curves."""
    originals = [t for t in trials if t.replica_of is None]
    bad = [t for t in originals if t.infeasible]
    finished = sum(t.status in ("completed", "infeasible") for t in originals)
    reasons = Counter(_reason(t, metric) for t in bad)
    return {
        "fraction": len(bad) / finished if finished else 0.0,
        "count": len(bad),
        "finished": finished,
        "reasons": [{"reason": r, "count": n} for r, n in reasons.most_common(5)],
        "where": _where(dims, originals),
        "value": value_concentration(dims, originals),
        "trial_ids": [t.id for t in trials if t.infeasible],
        "diverged": [{"trial_id": t.id, "reason": t.diverged} for t in trials if t.diverged is not None],
    }


def infeasible_warnings(summary: dict[str, Any]) -> list[dict[str, Any]]:
    if summary["finished"] < 5 or summary["fraction"] < INFEASIBLE_SHARE:
        return []
    reasons = "; ".join(f"{r['reason']} (x{r['count']})" for r in summary["reasons"][:3])
    message = (
        f"{summary['fraction']:.0%} of the finished trials ({summary['count']} of {summary['finished']}) are "
        f"infeasible: {reasons}."
    )
    where, value = summary["where"], summary.get("value")
    param = None
    if value is not None:
        param = value["param"]
        message += (
            f" They concentrate at {value['label']} = {fmt(value['value'])}: {value['bad']} of its {value['n']} trials "
            f"are infeasible, against {value['bad_elsewhere']} of {value['n_elsewhere']} with the other values. That "
            "value fails: fix what it turns on (or leave it out of the search space) rather than narrowing a range."
        )
    elif where is not None:
        param = where["param"]
        direction = "high" if where["side"] == "max" else "low"
        message += (
            f" They concentrate at {direction} {where['label']} (from about {fmt(where['from_value'])}): narrow "
            "the range or reparameterize the search space so fewer points are wasted."
        )
    else:
        message += " Adjust the search space to avoid such points; when they are spread everywhere, look for a bug."
    side = where["side"] if where is not None and value is None else None
    return [warning("infeasible", message, param=param, side=side)]


def instability_warnings(
    dims: Sequence[Dimension], trials: Sequence[TrialSummary], sign: float
) -> list[dict[str, Any]]:
    """`instability` for each arm whose best learning rate sits just below the learning rates
    where trials become infeasible (see `_edge_of_feasibility`)."""
    out = []
    groups: dict[str, list[TrialSummary]] = {}
    for t in trials:
        if t.replica_of is None and (t.feasible or t.infeasible):
            groups.setdefault(t.arm_key, []).append(t)
    for group in groups.values():
        arm = group[0].arm
        for dim in dims:
            if dim.varied and dim.ordered and is_learning_rate(dim.name) and dim.applies(arm):
                found = _edge_of_feasibility(dim, group, sign)
                if found is not None:
                    out.append(_instability(dim, arm, *found, n_arms=len(groups)))
    return out


# The playbook's instability procedure: the training-loss curves of (up to) this many completed
# trials just above the best learning rate, within this distance of it in unit range.
ABOVE_COUNT, ABOVE_GAP = 3, 0.25


def neighbours_above_best(
    dims: Sequence[Dimension], trials: Sequence[TrialSummary], sign: float
) -> list[tuple[Dimension, Any, TrialSummary, list[TrialSummary]]]:
    """Per arm and learning-rate declaration: `(dim, arm, best, trials)` with the feasible original
    trials whose learning rate lies just above the best one's (playbook 002, "Identifying unstable
    workloads", step 2: "plot training loss curves for learning rates just above lr*")."""
    out = []
    groups: dict[str, list[TrialSummary]] = {}
    for t in trials:
        if t.replica_of is None and t.feasible:
            groups.setdefault(t.arm_key, []).append(t)
    for group in groups.values():
        arm = group[0].arm
        for dim in dims:
            if not (dim.varied and dim.ordered and is_learning_rate(dim.name) and dim.applies(arm)):
                continue
            placed = sorted(
                ((u, t) for t in group if (u := unit(dim, t.params.get(dim.name))) is not None), key=lambda p: p[0]
            )
            if len(placed) < 3:
                continue
            u_best, best = min(placed, key=lambda p: sign * (p[1].objective or 0.0))
            above = [t for u, t in placed if u_best < u <= u_best + ABOVE_GAP][:ABOVE_COUNT]
            if above:
                out.append((dim, arm, best, above))
    return out


def loss_instability_warnings(
    dims: Sequence[Dimension],
    trials: Sequence[TrialSummary],
    sign: float,
    train_curves: Mapping[int, Curve],
    skip: Collection[str | None] = (),
) -> list[dict[str, Any]]:
    """`instability` when a trial just above the best learning rate has a training loss that rises
    after a steady decline (`diagnostics.loss_rises`): "if the learning rates > lr* show loss
    instability (loss goes up not down during periods of training), then it is likely that fixing
    the instability will result in better training". Declarations in `skip` already have an
    instability warning (the edge of feasibility)."""
    out = []
    found = neighbours_above_best(dims, trials, sign)
    n_arms = len({t.arm_key for t in trials if t.replica_of is None})
    for dim, arm, best, above in found:
        if dim.name in skip:
            continue
        rising = [(t, f) for t in above if t.id in train_curves and (f := loss_rises(train_curves[t.id])) is not None]
        if not rising:
            continue
        t, f = rising[0]
        where = f" in arm {arm_label(arm)}" if n_arms > 1 else ""
        message = (
            f"{dim.label}: just above the best value{where}, {fmt(best.params[dim.name])} (trial {best.id}), the "
            f"training loss of {len(rising)} of the {len(above)} nearest trials rises after declining (trial {t.id} at "
            f"{fmt(t.params[dim.name])}: from {fmt(f.facts['min'])} at step {fmt(f.facts['min_step'])} to "
            f"{fmt(f.facts['peak'])} at step {fmt(f.facts['peak_step'])}). The model is at the edge of training "
            "instability: try learning-rate warmup or gradient clipping, then search higher learning rates."
        )
        out.append(warning("instability", message, param=dim.name, trial_id=best.id))
    return out


def _edge_of_feasibility(
    dim: Dimension, group: Sequence[TrialSummary], sign: float
) -> tuple[TrialSummary, TrialSummary] | None:
    """The best trial and the nearest infeasible trial above it, when that one lies within
    `NEIGHBOUR_GAP` of the best (in unit range) and at least half of the trials from it upward are
    infeasible (infeasibility that sets in at high learning rates, not scattered failures)."""
    placed = [(unit(dim, t.params.get(dim.name)), t) for t in group if dim.name in t.params]
    points = sorted(((u, t) for u, t in placed if u is not None), key=lambda p: p[0])
    feasible = [(u, t) for u, t in points if t.feasible]
    if len(feasible) < 3 or len(feasible) == len(points):
        return None
    u_best, best = min(feasible, key=lambda p: sign * (p[1].objective or 0.0))
    above = [(u, t) for u, t in points if u > u_best and t.infeasible]
    if not above or above[0][0] - u_best > NEIGHBOUR_GAP:
        return None
    upward = [t for u, t in points if u >= above[0][0]]
    if 2 * sum(t.infeasible for t in upward) < len(upward):
        return None
    return best, above[0][1]


def _instability(dim: Dimension, arm: Any, best: TrialSummary, neighbour: TrialSummary, n_arms: int) -> dict[str, Any]:
    where = f" in arm {arm_label(arm)}" if n_arms > 1 else ""
    message = (
        f"{dim.label}: the best value{where}, {fmt(best.params[dim.name])} (trial {best.id}), sits right below "
        f"the infeasible trials, the first at {fmt(neighbour.params[dim.name])}: the model is at the edge of training "
        "instability, which is forcing a small learning rate. Try learning-rate warmup or gradient clipping, then "
        "search higher learning rates."
    )
    return warning("instability", message, param=dim.name, trial_id=best.id)


def _reason(trial: TrialSummary, metric: str) -> str:
    if trial.diverged is not None:
        return trial.diverged.split(":")[0]  # "training loss diverged", "no better than chance"
    if trial.status == "completed":
        return f"no finite value of {metric}"
    text = (trial.error or trial.fail_kind or "infeasible").strip().splitlines()[0][:120]
    return re.sub(r"\d+(\.\d+)?([eE][-+]?\d+)?", "N", text)


# A categorical or discrete value "concentrates" the infeasible trials when at least half of its
# trials are, twice the rate of the other values, one-sided Fisher exact p below this.
VALUE_ALPHA = 0.01


def value_concentration(dims: Sequence[Dimension], trials: Sequence[TrialSummary]) -> dict[str, Any] | None:
    """The value of a varied categorical or discrete hyperparameter where the infeasible trials
    concentrate (playbook, "Extracting insight": adjust the search space to avoid such points; a
    value such as `precision = fp16` failing every time is a bug in that value, not a range to
    narrow), the most significant one; None when no value stands out."""
    best: dict[str, Any] | None = None
    finished = [t for t in trials if t.infeasible or t.feasible]
    for dim in dims:
        if not (dim.varied and dim.type in ("categorical", "discrete")):
            continue
        placed = [(t.params.get(dim.name, t.arm.get(dim.name)), t.infeasible) for t in finished if dim.applies(t.arm)]
        for value in {json.dumps(v, sort_keys=True, default=str) for v, _ in placed}:
            found = _concentrated(dim, value, placed)
            if found is not None and (best is None or found["p_value"] < best["p_value"]):
                best = found
    return best


def _concentrated(dim: Dimension, key: str, placed: Sequence[tuple[Any, bool]]) -> dict[str, Any] | None:
    mine = [bad for v, bad in placed if json.dumps(v, sort_keys=True, default=str) == key]
    rest = [bad for v, bad in placed if json.dumps(v, sort_keys=True, default=str) != key]
    bad, n, bad_rest, n_rest = sum(mine), len(mine), sum(rest), len(rest)
    if n < 3 or not n_rest or 2 * bad < n or bad / n < 2 * bad_rest / n_rest:
        return None
    p = float(stats.fisher_exact([[bad, n - bad], [bad_rest, n_rest - bad_rest]], alternative="greater")[1])
    if p >= VALUE_ALPHA:
        return None
    return {
        "param": dim.name,
        "label": dim.label,
        "value": json.loads(key),
        "bad": bad,
        "n": n,
        "bad_elsewhere": bad_rest,
        "n_elsewhere": n_rest,
        "p_value": p,
    }


def _where(dims: Sequence[Dimension], trials: Sequence[TrialSummary]) -> dict[str, Any] | None:
    """The hyperparameter whose unit position separates infeasible from feasible trials most
    (Mann-Whitney p < 0.01 and medians at least a quarter of the range apart)."""
    best: dict[str, Any] | None = None
    for dim in dims:
        if not (dim.varied and dim.ordered):
            continue
        found = _separation(dim, trials)
        if found is not None and (best is None or found["gap"] > best["gap"]):
            best = found
    return best


def _separation(dim: Dimension, trials: Sequence[TrialSummary]) -> dict[str, Any] | None:
    bad: list[tuple[float, TrialSummary]] = []
    good: list[tuple[float, TrialSummary]] = []
    for t in trials:
        u = unit(dim, t.params.get(dim.name)) if dim.name in t.params and dim.applies(t.arm) else None
        if u is not None and (t.infeasible or t.feasible):
            (bad if t.infeasible else good).append((u, t))
    if len(bad) < 3 or len(good) < 3:
        return None
    ub, ug = np.array([u for u, _ in bad]), np.array([u for u, _ in good])
    gap = float(np.median(ub) - np.median(ug))
    if abs(gap) < 0.25 or stats.mannwhitneyu(ub, ug).pvalue >= 0.01:
        return None
    side = "max" if gap > 0 else "min"
    beyond = [(u, t) for u, t in bad if (u > np.median(ug)) == (side == "max")]
    edge = min(beyond, key=lambda p: p[0]) if side == "max" else max(beyond, key=lambda p: p[0])
    return {
        "param": dim.name,
        "label": dim.label,
        "side": side,
        "gap": abs(gap),
        "from_value": edge[1].params[dim.name],
    }
