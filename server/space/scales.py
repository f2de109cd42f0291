"""The scales of a range (linear, log, reverse_log): each a bijection between a value range and
[0, 1], and the scale's space in which the analysis measures distances (docs/spec.md,
"Hyperparameters": reverse_log makes 1 - value log-uniform).

The arithmetic of `from_unit` and `to_unit` is what stored studies were laid out with: their unit
points map to params and back through exactly these expressions
(tests/server/space/test_unit_cube_golden.py pins them bit for bit)."""

from __future__ import annotations

import math


def from_unit(scale: str, low: float, high: float, u: float) -> float:
    """The value at `u` of [low, high], uniform in the scale's space (not clipped to the range)."""
    if scale == "log":
        return math.exp(math.log(low) + u * (math.log(high) - math.log(low)))
    if scale == "reverse_log":
        return 1.0 - math.exp(math.log(1.0 - high) + (1.0 - u) * (math.log(1.0 - low) - math.log(1.0 - high)))
    return low + u * (high - low)


def to_unit(scale: str, low: float, high: float, value: float) -> float:
    """Where `value` sits in [low, high], in the scale's space, clipped to [0, 1]."""
    if scale == "log":
        u = (math.log(value) - math.log(low)) / (math.log(high) - math.log(low))
    elif scale == "reverse_log":
        u = 1.0 - (math.log(1.0 - value) - math.log(1.0 - high)) / (math.log(1.0 - low) - math.log(1.0 - high))
    else:
        u = (value - low) / (high - low)
    return min(max(u, 0.0), 1.0)


def to_scale(scale: str, value: float) -> float | None:
    """`value` in the scale's space (log v, -log(1 - v), or v itself), increasing with `value`;
    None outside the scale's domain."""
    if scale == "log":
        return math.log(value) if value > 0 else None
    if scale == "reverse_log":
        return -math.log(1.0 - value) if value < 1 else None
    return value


def from_scale(scale: str, x: float) -> float:
    """The inverse of `to_scale`."""
    if scale == "log":
        return math.exp(x)
    if scale == "reverse_log":
        return 1.0 - math.exp(-x)
    return x
