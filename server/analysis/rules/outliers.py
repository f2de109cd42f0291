"""A lone outlier evaluation at a trial's best step: flagged, and not taken as the trial's best.

Playbook (002), "Examining the training curves": a trial's best value should not depend on a lucky
step ("high step-to-step variance ... makes the best value depend on a lucky step"). A glitched
evaluation (a partial validation batch, a logging bug writing 0.0) is the extreme case: one point
far outside the curve's own noise, which would otherwise become the study's best trial and read as
overfitting (best early, "rising" after). The test is local, so a curve's trend is not mistaken for
a glitch: the best point's distance from the line through its neighbours (their mean inside the
curve, the line through the two before it at the end) against the curve's own point-to-point noise
(from second differences, robust to the point itself), and against a floor of the curve's range
(quantized metrics, whose noise reads 0 between identical evaluations)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from hpo.server.analysis.model import Curve, fmt

# The best point is an outlier when it lies this many noise levels beyond its neighbours' line...
OUTLIER_NOISE = 6.0
# ...and more than this share of the range of the rest of the curve.
OUTLIER_RANGE = 0.05
MIN_POINTS = 6


@dataclass(frozen=True)
class RobustBest:
    """The best genuine evaluation of a curve whose best point is a lone outlier."""

    value: float
    step: int
    reason: str
    outlier_step: int


def robust_best(curve: Curve, sign: float) -> RobustBest | None:
    """None when the best point of `curve` (oriented by `sign`: +1 when lower is better) is an
    ordinary evaluation; else the best of the others, with the reason the best one was set aside."""
    finite = curve.finite()
    v = sign * finite.values
    n = len(v)
    if n < MIN_POINTS:
        return None
    b = int(np.argmin(v))
    gap, expected, width = _gap(v, b)
    rest = np.delete(v, b)
    sigma = _noise(v, b)
    floor = OUTLIER_RANGE * float(np.ptp(rest))
    if not (gap > OUTLIER_NOISE * sigma * width and gap > floor):
        return None
    k = int(np.argmin(rest))
    k = k if k < b else k + 1
    value, step = float(finite.values[k]), int(finite.steps[k])
    reason = (
        f"the evaluation at step {int(finite.steps[b])} ({fmt(float(finite.values[b]))}) lies "
        f"{gap / max(sigma, 1e-300):.0f} noise levels beyond its neighbours ({fmt(sign * expected)})"
        if sigma > 0
        else f"the evaluation at step {int(finite.steps[b])} ({fmt(float(finite.values[b]))}) lies far beyond its "
        f"neighbours ({fmt(sign * expected)})"
    )
    return RobustBest(value, step, reason, int(finite.steps[b]))


def _gap(v: np.ndarray, b: int) -> tuple[float, float, float]:
    """(how far point b lies below what its neighbours predict, the prediction, the noise
    multiplier of that difference: its standard deviation in units of one point's noise)."""
    if 0 < b < len(v) - 1:
        expected = (v[b - 1] + v[b + 1]) / 2
        return float(expected - v[b]), float(expected), math.sqrt(1.5)
    expected = 2 * v[b - 1] - v[b - 2] if b == len(v) - 1 else 2 * v[1] - v[2]  # extrapolated at an end
    return float(expected - v[b]), float(expected), math.sqrt(6.0)


def _noise(v: np.ndarray, b: int) -> float:
    """One point's noise from the curve's second differences (variance 6 sigma^2 each): robust
    (median absolute deviation), else, where that is 0 (a quantized metric), their standard
    deviation away from point b."""
    d2 = v[:-2] - 2 * v[1:-1] + v[2:]
    mad = 1.4826 * float(np.median(np.abs(d2 - np.median(d2))))
    if mad > 0:
        return mad / math.sqrt(6.0)
    away = np.delete(d2, [i for i in (b - 2, b - 1, b) if 0 <= i < len(d2)])
    return float(np.std(away)) / math.sqrt(6.0) if len(away) > 1 else 0.0
