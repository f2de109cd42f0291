"""Moving a range's bounds in the space of its scale: a wider bound past an edge where the best
trials sit (the playbook, "How can search space boundaries be checked?"), and a range refined
around chosen values (the exploit recipe, docs/rounds.md)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from hpo.server.space.scales import from_scale, to_scale
from hpo.server.space.search_space import Dimension, from_unit


def widened(dim: Dimension, side: str, by: float = 0.5) -> Any:
    """A wider bound to try on `side` ("min" or "max"): the range extended by `by` of its width in
    the scale's space, kept inside the scale's domain. For discrete values, one more value
    continuing the sequence. None when the range cannot be widened on that side."""
    if dim.type == "discrete":
        return _next_discrete(dim.values, side)
    assert dim.min is not None and dim.max is not None
    new = from_unit(dim, -by if side == "min" else 1.0 + by)
    if dim.scale == "reverse_log":
        new = max(new, 0.0)
    elif dim.scale == "linear" and dim.min >= 0:
        new = max(new, 0.0)
        if dim.max <= 1.0 and dim.type == "float":
            new = min(new, 1.0)
    if dim.type == "int":
        new = math.floor(new) if side == "min" else math.ceil(new)
        new = max(new, 1) if dim.scale == "log" else new
    old = dim.min if side == "min" else dim.max
    if (side == "min" and new >= old) or (side == "max" and new <= old):
        return None
    if dim.type == "int":
        return int(new)
    return 1.0 - _round_sig(1.0 - new) if dim.scale == "reverse_log" else _round_sig(new)


def refined(
    scale: str, low: float, high: float, values: Sequence[float], extend: tuple[bool, bool]
) -> tuple[float, float]:
    """[low, high] narrowed around `values` in the scale's space (padded by a quarter of their
    spread, at least a twentieth of the range, never past the range), and reaching half the
    range's width past its min or max where `extend` says so (the best trials sit at that edge)."""
    lo_old, hi_old = _scaled(scale, low), _scaled(scale, high)
    points = [_scaled(scale, float(v)) for v in values] or [lo_old, hi_old]
    lo, hi = min(points), max(points)
    pad = max(0.25 * (hi - lo), 0.05 * (hi_old - lo_old))
    lo, hi = max(lo_old, lo - pad), min(hi_old, hi + pad)
    if extend[0]:
        lo = lo_old - 0.5 * (hi_old - lo_old)
    if extend[1]:
        hi = hi_old + 0.5 * (hi_old - lo_old)
    a, b = sorted((from_scale(scale, lo), from_scale(scale, hi)))
    return a, b


def _round_sig(x: float, digits: int = 3) -> float:
    """`x` rounded to `digits` significant digits (a suggested bound a person reads)."""
    if x == 0 or not math.isfinite(x):
        return x
    return round(x, digits - 1 - int(math.floor(math.log10(abs(x)))))


def _scaled(scale: str, value: float) -> float:
    x = to_scale(scale, value)
    if x is None:
        raise ValueError(f"{value} is outside the domain of the {scale} scale")
    return x


def _next_discrete(values: Sequence[Any], side: str) -> Any:
    nums = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    if len(nums) < 2 or len(nums) != len(values):
        return None
    a, b = (nums[1], nums[0]) if side == "min" else (nums[-2], nums[-1])
    ratios = [y / x for x, y in zip(nums, nums[1:], strict=False) if x > 0]
    geometric = len(ratios) == len(nums) - 1 and max(ratios) / min(ratios) < 1.01 and min(ratios) > 1.0
    new = b * (b / a) if geometric else b + (b - a)
    if all(isinstance(v, int) for v in nums):
        return int(round(new))
    return _round_sig(new)
