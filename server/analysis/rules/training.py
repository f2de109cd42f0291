"""Study-level training checks: where retrospective checkpoint selection finds the best step,
gradient clipping thresholds, warmup length.

Playbook, "Deciding how long to train when training is not compute-bound": never tune
max_train_steps; plot the step that retrospective checkpoint selection finds. If the best step is
always in the first 10% of training, max_train_steps is way too high; if it is consistently in the
last 25%, training longer (and re-tuning the decay schedule) may help.
"Gradient clipping": choose the threshold from the 90th percentile of the unclipped gradient norms;
more than half of the updates clipped is extremely aggressive, a strange way to lower the learning
rate. "Learning rate warmup": warmup over 5% of max_train_steps calls for more steps."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from hpo.server.analysis.model import TrialSummary, arm_label, fmt, warning
from hpo.server.space.search_space import Dimension

if TYPE_CHECKING:  # annotations only: the rules take plain values, never a database
    from hpo.server.analysis.load import CurveStats

EARLY, LATE = 0.10, 0.75
# "Consistently" in the last 25%: at least this share of the best trials. A curve that has flattened
# puts its best step anywhere in the flat part by noise alone, often half the time in the last
# quarter, so a looser share would raise the advice by chance.
CONSISTENT = 0.9
# The trials the advice judges: the better half of each arm, at least 5 (fewer are too easily all
# late, or all early, by chance).
TOP_SHARE, TOP_MIN = 0.5, 5
AGGRESSIVE = 0.5
# Practically converged: the late gain is below this share of the whole run's gain.
LATE_GAIN = 0.02
LONG_WARMUP = 0.05


def best_step_summary(
    trials: Sequence[TrialSummary], sign: float, horizon: float | None, objective: CurveStats | None = None
) -> dict[str, Any]:
    """`{max_train_steps, best_step_fractions, top: {trial_ids, fractions}, advice, per_arm}`:
    fractions of max_train_steps for every feasible original trial (by trial number), and for the
    better half of each arm (at least 5), which the advice judges arm by arm (pooling arms would
    let one arm's late best steps speak for another): "too_long" when all fall in the first 10%,
    "train_longer" when 90% or more fall in the last 25% *and* most of those curves are still
    improving at the end (with `objective`, the curve statistics: a late net gain beyond 3 noise
    levels). A converged curve puts its best step anywhere in its flat tail by noise alone, so late
    best steps on flat curves are no reason to train longer. Top-level `advice` is the first arm's
    that fires, `top` every arm's judged trials."""
    feasible = sorted((t for t in trials if t.feasible and t.replica_of is None), key=lambda t: t.number)
    if not horizon or horizon <= 0:
        return {"max_train_steps": horizon, "best_step_fractions": [], "top": None, "advice": None, "per_arm": []}
    fractions = [_fraction(t, horizon) for t in feasible]
    per_arm: list[dict[str, Any]] = []
    top_ids: list[int] = []
    all_fractions: list[float] = []
    for label, top in _top_per_arm(feasible, sign):
        top_fractions = [_fraction(t, horizon) for t in top]
        improving = [t.id for t in top if _still_improving(t, objective, sign)]
        late = [f >= LATE for f in top_fractions]
        advice = None
        if len(top) >= TOP_MIN and all(f <= EARLY for f in top_fractions):
            advice = "too_long"
        elif len(top) >= TOP_MIN and sum(late) >= CONSISTENT * len(top) and 2 * len(improving) > len(top):
            advice = "train_longer"
        per_arm.append(
            {
                "label": label,
                "trial_ids": [t.id for t in top],
                "fractions": top_fractions,
                "still_improving": improving,
                "advice": advice,
            }
        )
        top_ids += [t.id for t in top]
        all_fractions += top_fractions
    return {
        "max_train_steps": horizon,
        "best_step_fractions": fractions,
        "top": {"trial_ids": top_ids, "fractions": all_fractions},
        "advice": next((a["advice"] for a in per_arm if a["advice"]), None),
        "per_arm": per_arm,
    }


def _still_improving(t: TrialSummary, objective: CurveStats | None, sign: float) -> bool:
    """Whether the trial's objective curve still improves over its late part by more than 3 noise
    levels and, practically, by more than `LATE_GAIN` of what the whole run gained (the same
    yardsticks as diagnostics.still_improving)."""
    if objective is None:
        return True
    found = objective.of(t.id)
    if found is None or found["n"] < 5:
        return found is None
    gain = -sign * found["late_change"]
    total = found["maximum"] - found["minimum"]
    return gain > max(3.0 * math.sqrt(2.0) * found["late_noise"], LATE_GAIN * total)


def max_train_steps_warnings(summary: Mapping[str, Any]) -> list[dict[str, Any]]:
    out = []
    horizon = summary["max_train_steps"]
    multi = len(summary.get("per_arm") or []) > 1
    for arm in summary.get("per_arm") or []:
        advice, fractions = arm["advice"], arm["fractions"]
        if advice is None:
            continue
        where = f" of arm {arm['label']}" if multi else ""
        if advice == "too_long":
            latest = max(fractions) * horizon
            message = (
                f"The best step of every one of the {len(fractions)} best trials{where} falls in the first 10% of "
                f"training (the latest at step {fmt(latest)} of max_train_steps = {fmt(horizon)}): max_train_steps is "
                f"far too high. Lower it (to about {fmt(_nice(3 * latest))}) and spend the compute on more trials."
            )
        else:
            late = sum(f >= LATE for f in fractions)
            message = (
                f"In {late} of the {len(fractions)} best trials{where} the best step falls in the last 25% of training "
                f"(max_train_steps = {fmt(horizon)}) and {len(arm['still_improving'])} are still improving at the end: "
                f"they may benefit from training longer. Raise max_train_steps (e.g. to {fmt(_nice(1.5 * horizon))}) "
                "and re-tune the learning-rate decay schedule."
            )
        out.append(warning("max_train_steps", message, param="max_train_steps"))
    return out


def grad_clip_summary(per_trial: Sequence[Mapping[str, Any]], arms: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """`{metric, p90, clipped_fraction, trial_id, per_arm}`: the 90th percentile of the unclipped
    gradient norm of each arm's best trial (the top-level figures are the best arm's)."""
    by_trial = {row["trial_id"]: row for row in per_trial}
    per_arm = []
    for arm in arms:
        row = by_trial.get(arm["best_trial_id"])
        if row is not None:
            per_arm.append({"arm": arm["arm"], "label": arm["label"], **row})
    lead = per_arm[0] if per_arm else {}
    return {
        "metric": "train/grad_norm",
        "p90": lead.get("p90"),
        "clipped_fraction": lead.get("clipped_fraction"),
        "trial_id": lead.get("trial_id"),
        "per_arm": per_arm,
    }


def clipping_warnings(summary: Mapping[str, Any]) -> list[dict[str, Any]]:
    out = []
    for row in summary["per_arm"]:
        clipped = row.get("clipped_fraction")
        if clipped is not None and clipped > AGGRESSIVE:
            threshold = f" (the 90th percentile of its gradient norms is {fmt(row['p90'])})" if row.get("p90") else ""
            message = (
                f"Trial {row['trial_id']}, the best of arm {row['label']}, clips {clipped:.0%} of its updates: such "
                f"aggressive clipping is a strange way of lowering the learning rate. Lower the learning rate instead, "
                f"or clip only outliers{threshold}."
            )
            out.append(warning("aggressive_clipping", message, trial_id=row["trial_id"]))
    return out


def warmup_warnings(
    dims: Sequence[Dimension], trainer: Mapping[str, Any], arms: Sequence[Mapping[str, Any]], horizon: float | None
) -> list[dict[str, Any]]:
    """`long_warmup` when the warmup of the best trial (a tuned or fixed `warmup_steps`, or a
    trainer setting) exceeds 5% of max_train_steps."""
    if not horizon:
        return []
    fixed = {d.name: d.value for d in dims if d.role == "fixed"}
    for arm in arms:
        params = {**trainer, **fixed, **(arm.get("best_params") or {})}
        steps = _warmup_steps(params, horizon)
        if steps is not None and steps > LONG_WARMUP * horizon:
            message = (
                f"Warmup of {fmt(steps)} steps is {steps / horizon:.0%} of max_train_steps = {fmt(horizon)} (over 5%): "
                f"increase max_train_steps to account for it, e.g. to {fmt(horizon + steps)}."
            )
            return [warning("long_warmup", message, param="warmup_steps")]
    return []


def _warmup_steps(params: Mapping[str, Any], horizon: float) -> float | None:
    for key in ("warmup_steps", "lr_warmup_steps", "num_warmup_steps"):
        if _number(params.get(key)):
            return float(params[key])
    for key in ("warmup_fraction", "warmup_ratio"):
        if _number(params.get(key)):
            return float(params[key]) * horizon
    return None


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _fraction(trial: TrialSummary, horizon: float) -> float:
    return round(float(trial.best_step or 0) / horizon, 4)


def _top_per_arm(feasible: Sequence[TrialSummary], sign: float) -> list[tuple[str, list[TrialSummary]]]:
    groups: dict[str, list[TrialSummary]] = {}
    for t in feasible:
        groups.setdefault(t.arm_key, []).append(t)
    out = []
    for group in groups.values():
        group.sort(key=lambda t: sign * (t.objective or 0.0))
        out.append((arm_label(group[0].arm), group[: max(TOP_MIN, math.ceil(TOP_SHARE * len(group)))]))
    return out


def _nice(x: float) -> float:
    """Rounds up to 1, 2 or 5 times a power of ten."""
    if x <= 0:
        return x
    power = 10 ** math.floor(math.log10(x))
    return next(m * power for m in (1, 2, 5, 10) if m * power >= x)


def caveats(dims: Sequence[Dimension], trainer: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The fixed hyperparameters (and max_train_steps) the conclusions hold for."""
    out = []
    for d in dims:
        if d.role == "fixed":
            cond = f" where {d.label[len(d.name) + 2 : -1]}" if d.when else ""
            out.append(
                {
                    "param": d.name,
                    "value": d.value,
                    "when": d.when,
                    "message": f"{d.name} is fixed at {fmt(d.value)}{cond}: the conclusions hold for this value only.",
                }
            )
    if trainer.get("max_train_steps"):
        steps = trainer["max_train_steps"]
        out.append(
            {
                "param": "max_train_steps",
                "value": steps,
                "when": None,
                "message": f"Every trial trains for max_train_steps = {fmt(steps)}; conclusions may change with it.",
            }
        )
    return out
