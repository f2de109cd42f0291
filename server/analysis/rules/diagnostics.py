"""Training-curve checks for the best few trials of each arm.

Playbook, "Examining the training curves": for every study, look at the training curves of at
least the best few trials and ask: problematic overfitting? high step-to-step variance late in
training? still improving at the end? saturated long before the final step? And "training loss
increasing during training usually indicates a bug in the training pipeline".

Every check works on the validation objective oriented so that lower is better, smoothed with a
running median, and measures changes against two yardsticks: the curve's own range (how much the
trial improved) and its step-to-step noise (a robust estimate from successive differences). A
change must clear both, so clean curves and pure noise raise nothing.

Overfitting is the exception: its rise is judged against the best value itself and the curve's
late noise (`overfit_threshold`), never against the range, which the initial drop from chance
dominates (a validation error doubling from 0.05 to 0.10 after its best is a tenth of a 0.9 → 0.05
range, yet plainly overfitting)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hpo.server.analysis.model import Curve

# Overfitting: the objective ends worse than its best by more than this share of the best value
# (and by more than the noise allows, `overfit_threshold`).
OVERFIT_REL = 0.05
# High variance: late step-to-step noise above this share of the range.
LATE_NOISE = 0.03
# Still improving: the fitted improvement over the last quarter above this share of the range.
LATE_GAIN = 0.02
# Saturated early: within SAT_CLOSE of the best level before SAT_BY of training.
SAT_CLOSE, SAT_BY = 0.05, 0.20
# Training loss rising: the smoothed loss ends this share of its range above its minimum.
TRAIN_RISE = 0.10
NOISE_CLEARANCE = 3.0
LATE_SHARE, LATE_POINTS = 0.25, 8
MIN_POINTS = 5
# The evidence each curve rule needs (docs/analysis.md, "The evidence each rule needs"); below it
# the rule abstains and the analysis lists it under `skipped` (`curve_needs`). high_variance and
# still_improving judge the late window (the last quarter, at least the last LATE_POINTS
# evaluations): with fewer than twice LATE_POINTS evaluations that window reaches into the first
# half of training and swallows the first drop from chance. Overfitting needs a best and a sustained
# rise after it, and a training loss to tell it from divergence.
NEEDS = {
    "high_variance": ("evaluations", 2 * LATE_POINTS),
    "still_improving": ("evaluations", 2 * LATE_POINTS),
    "overfitting": ("evaluations", LATE_POINTS),
}
TRAIN_LOGS_NEEDED = MIN_POINTS


@dataclass(frozen=True)
class Finding:
    """One problem a check found; `facts` holds the numbers behind it (in the metric's units)."""

    kind: str
    facts: dict[str, Any] = field(default_factory=dict)


def check_curves(
    objective: Curve, train_loss: Curve | None, *, sign: float = 1.0, horizon: float | None = None
) -> list[Finding]:
    """Runs every curve check on one trial. `objective` is the validation objective metric,
    `sign` +1 when lower is better and -1 otherwise, `train_loss` may be None (the checks that need
    it then judge on validation alone or are skipped), `horizon` is max_train_steps (default: the
    last step seen). Answers the findings, each at most once."""
    valid = _oriented(objective, sign)
    train = train_loss.finite() if train_loss is not None else None
    if len(valid) < MIN_POINTS:
        return []
    end = float(horizon or valid.steps[-1])
    findings = [
        overfitting(valid, train) if _enough("overfitting", valid) else None,
        high_variance(valid) if _enough("high_variance", valid) else None,
        still_improving(valid) if _enough("still_improving", valid) else None,
        training_loss_rising(train) if train is not None else None,
    ]
    if findings[0] is None:  # a curve that overfits is not "saturated"
        findings.append(saturated_early(valid, train, end))
    return [_in_units(f, sign) for f in findings if f is not None]


def _enough(check: str, valid: Curve) -> bool:
    return len(valid) >= NEEDS[check][1]


def curve_needs(objective: Curve | None, train_loss: Curve | None, train_name: str) -> list[tuple[str, str]]:
    """The curve rules that abstain on one trial for want of evidence, as `(check, reason)`:
    `("high_variance", "5 evaluations, needs 16")`, or overfitting without `train_name` logged
    (`"needs train/loss"`) or with too few logs of it."""
    n = len(objective.finite()) if objective is not None else 0
    out = [(check, f"{n} {unit}, needs {need}") for check, (unit, need) in NEEDS.items() if n < need]
    if not any(check == "overfitting" for check, _ in out):
        logs = len(train_loss.finite()) if train_loss is not None else 0
        if logs == 0:
            out.append(("overfitting", f"needs {train_name}"))
        elif logs < TRAIN_LOGS_NEEDED:
            out.append(("overfitting", f"{logs} logs of {train_name}, needs {TRAIN_LOGS_NEEDED}"))
    return out


def overfit_threshold(best: np.ndarray | float, sigma: np.ndarray | float, n: np.ndarray | float) -> Any:
    """How far the end of a curve must lie beyond its best value to count as overfitting: more than
    `OVERFIT_REL` of the best value, and more than the noise can explain. The best is the extreme of
    n noisy evaluations, about sigma * sqrt(2 ln n) beyond the level, and the end level (a mean of 3)
    carries noise too, hence sigma * (sqrt(2 ln n) + 2). Vectorized over arrays."""
    n = np.maximum(np.asarray(n, dtype=float), 2.0)
    return np.maximum(OVERFIT_REL * np.abs(best), np.asarray(sigma) * (np.sqrt(2.0 * np.log(n)) + 2.0))


def overfitting(valid: Curve, train: Curve | None) -> Finding | None:
    """Problematic overfitting (playbook: "the validation error starts increasing at some point
    during training"): the validation objective first improves (by more than 3 noise levels), then
    ends (the median of the last three evaluations) worse than its best smoothed level by more than
    `overfit_threshold`, with a rising trend (t statistic over 2), while the training loss keeps
    falling (required: a trial that logs no training loss is never called overfitting)."""
    s = smooth(valid.values)
    b = int(np.argmin(s))
    after = valid.values[b:]
    if len(after) < 4:
        return None
    span, end = float(np.ptp(s)), float(np.median(valid.values[-3:]))
    rise, learned = end - float(s[b]), float(s[: b + 1].max() - s[b])
    sigma = max(noise(after), noise(valid.values))
    threshold = float(overfit_threshold(float(s[b]), sigma, len(valid)))
    if span == 0 or rise <= threshold or learned <= NOISE_CLEARANCE * sigma:
        return None
    if _slope(valid.steps[b:], after)[1] < 2:  # a sustained rise, not a noisy end
        return None
    # Overfitting is validation getting worse *while training keeps improving*; without a training
    # loss a rising validation curve may as well be divergence, so nothing is claimed.
    if train is None or len(train) < MIN_POINTS:
        return None
    t = smooth(train.values)
    at_best = float(np.interp(valid.steps[b], train.steps, t))
    if not t[-1] < at_best:
        return None
    facts: dict[str, Any] = {"best_step": valid.steps[b], "best": s[b], "end": end, "rise_share": rise / span}
    facts.update(train_at_best=at_best, train_end=float(t[-1]))
    return Finding("overfitting", facts)


def high_variance(valid: Curve) -> Finding | None:
    """High step-to-step variance late in training: the noise over the last quarter of the steps
    (at least the last 8 evaluations) exceeds `LATE_NOISE` of the curve's range. The noise is the
    root mean square of the detrended successive differences: spikes count, a trend does not."""
    late = _last_share(valid)
    span = float(np.ptp(smooth(valid.values)))
    if len(late) < 4 or span == 0:
        return None
    d = np.diff(late.values)
    sigma = float(np.std(d, ddof=1) / np.sqrt(2))
    if sigma <= LATE_NOISE * span:
        return None
    return Finding("high_variance", {"noise": sigma, "noise_share": sigma / span, "from_step": late.steps[0]})


def still_improving(valid: Curve) -> Finding | None:
    """Still improving at the end: a line fitted to the last quarter (at least the last 8
    evaluations) falls by more than `LATE_GAIN` of the range and 3 noise levels, with a t
    statistic beyond 4."""
    late = _last_share(valid)
    span = float(np.ptp(smooth(valid.values)))
    if len(late) < 4 or span == 0:
        return None
    slope, t_stat = _slope(late.steps, late.values)
    gain = -slope * float(late.steps[-1] - late.steps[0])
    if t_stat > -4 or gain <= max(LATE_GAIN * span, NOISE_CLEARANCE * noise(late.values)):
        return None
    return Finding("still_improving", {"gain": gain, "gain_share": gain / span, "from_step": late.steps[0]})


def saturated_early(valid: Curve, train: Curve | None, horizon: float) -> Finding | None:
    """Saturated long before the final step: both the validation objective and (when reported)
    the training loss come within `SAT_CLOSE` of their best level in the first `SAT_BY` of
    training, and the objective stays there to the end."""
    at = _saturation_step(valid)
    s = smooth(valid.values)
    start = float(valid.steps[0])
    if at is None or horizon <= start or (at - start) > SAT_BY * (horizon - start):
        return None
    if s[-1] - s.min() > 2 * SAT_CLOSE * np.ptp(s):
        return None
    if train is not None and len(train) >= MIN_POINTS:
        train_at = _saturation_step(train)
        if train_at is None or (train_at - start) > SAT_BY * (horizon - start):
            return None
    return Finding("saturated_early", {"saturated_at": at, "share": (at - start) / (horizon - start)})


def training_loss_rising(train: Curve) -> Finding | None:
    """The training loss ends well above its minimum (by `TRAIN_RISE` of its range and 3 noise
    levels of its smoothed values)."""
    if len(train) < MIN_POINTS:
        return None
    t = smooth(train.values)
    b = int(np.argmin(t))
    # The end level is the median of the last half-window of raw points: `smooth` pads the edge
    # with the last value, which would make its last point that one noisy step.
    tail = (window(len(t)) // 2) | 1
    end = float(np.median(train.values[-tail:]))
    span, rise = float(np.ptp(t)), end - float(t[b])
    clearance = NOISE_CLEARANCE * noise(train.values) * 1.25 / float(np.sqrt(tail))
    if len(t) - b < 3 or span == 0 or rise <= max(TRAIN_RISE * span, clearance):
        return None
    return Finding("training_loss_rising", {"min_step": train.steps[b], "min": t[b], "end": end})


def loss_rises(train: Curve) -> Finding | None:
    """Playbook, "Identifying unstable workloads": a training loss that "goes up not down during
    periods of training" after a steady decline. The largest rise of the smoothed loss above its
    running minimum, once the loss has declined (that minimum is not the first point), must exceed
    `TRAIN_RISE` of the loss's range and 3 noise levels of the smoothed values. Unlike
    `training_loss_rising`, a rise the run later recovers from counts."""
    if len(train) < MIN_POINTS:
        return None
    t = smooth(train.values)
    floor = np.minimum.accumulate(t)
    rise = t - floor
    peak = int(np.argmax(rise))
    low = int(np.argmin(t[: peak + 1])) if peak else 0
    span = float(np.ptp(t))
    if low == 0 or span == 0 or rise[peak] <= max(TRAIN_RISE * span, NOISE_CLEARANCE * smoothed_noise(train.values)):
        return None
    return Finding(
        "loss_rises",
        {"min_step": train.steps[low], "min": t[low], "peak_step": train.steps[peak], "peak": t[peak]},
    )


def window(n: int) -> int:
    """The running median's odd window: 3 for short curves, about a tenth of the points for long ones."""
    return max(3, (n // 10) | 1)


def smooth(values: np.ndarray, w: int | None = None) -> np.ndarray:
    """Running median over an odd window (`window(n)` by default), edges padded with the edge values."""
    n = len(values)
    w = w or window(n)
    if n < 3 or w < 2:
        return np.asarray(values, dtype=float)
    half = w // 2
    padded = np.pad(np.asarray(values, dtype=float), half, mode="edge")
    return np.median(np.lib.stride_tricks.sliding_window_view(padded, 2 * half + 1), axis=1)


def noise(values: np.ndarray) -> float:
    """Step-to-step noise: a robust standard deviation of successive differences (median absolute
    deviation around their median, so a steady trend does not count), divided by sqrt(2)."""
    if len(values) < 3:
        return 0.0
    d = np.diff(np.asarray(values, dtype=float))
    return float(1.4826 * np.median(np.abs(d - np.median(d))) / np.sqrt(2))


def late_noise(curve: Curve) -> float:
    """Robust step-to-step noise of a curve's last quarter (at least its last 8 evaluations): how
    much a trial's best value can owe to one lucky evaluation."""
    finite = curve.finite()
    return noise(_last_share(finite).values) if len(finite) >= 4 else 0.0


def smoothed_noise(values: np.ndarray) -> float:
    """The noise left in `smooth(values)`: a median of w points has about 1.25 sigma / sqrt(w)."""
    return noise(values) * 1.25 / float(np.sqrt(window(len(values))))


def _oriented(curve: Curve, sign: float) -> Curve:
    finite = curve.finite()
    return Curve(finite.steps, sign * finite.values)


def _in_units(finding: Finding, sign: float) -> Finding:
    """Turns oriented levels back into the metric's own values for messages."""
    facts = dict(finding.facts)
    for key in ("best", "end") if finding.kind == "overfitting" else ():
        facts[key] = sign * facts[key]
    return Finding(finding.kind, {k: _plain(v) for k, v in facts.items()})


def _plain(value: Any) -> Any:
    if isinstance(value, np.integer):
        return int(value)
    return float(value) if isinstance(value, np.floating) else value


def _last_share(curve: Curve, share: float = LATE_SHARE) -> Curve:
    """The evaluations in the last `share` of the steps, or the last `LATE_POINTS` if more."""
    first, last = float(curve.steps[0]), float(curve.steps[-1])
    start = min(int(np.searchsorted(curve.steps, last - share * (last - first))), max(len(curve) - LATE_POINTS, 0))
    return Curve(curve.steps[start:], curve.values[start:])


def _slope(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Least-squares slope and its t statistic (infinite when the fit is exact)."""
    x = x - x.mean()
    sxx = float(np.dot(x, x))
    if sxx == 0:
        return 0.0, 0.0
    slope = float(np.dot(x, y - y.mean()) / sxx)
    resid = y - y.mean() - slope * x
    dof = len(x) - 2
    se = float(np.sqrt(np.dot(resid, resid) / dof / sxx)) if dof > 0 else 0.0
    if se == 0:
        return slope, float(np.sign(slope) * np.inf) if slope else 0.0
    return slope, slope / se


def _saturation_step(curve: Curve) -> float | None:
    s = smooth(curve.values)
    span = float(np.ptp(s))
    if span == 0:
        return None
    close = np.nonzero(s - s.min() <= SAT_CLOSE * span)[0]
    return float(curve.steps[close[0]])
