"""The search space as the analysis sees it: plain data read from a study's stored spec.

Positions are measured in the space of each hyperparameter's scale (a unit value in [0, 1], the
same mapping the Halton layout uses), so "near the edge" means the same thing for a log-scaled
learning rate and a linear dropout rate."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

ORDERED_TYPES = ("float", "int", "discrete")

# Playbook, "Examining the training curves": no overfitting warning against a scientific
# hyperparameter that is itself a regularizer (low settings of it are expected to overfit).
REGULARIZER_WORDS = (
    "weight_decay",
    "dropout",
    "label_smoothing",
    "l2_",
    "mixup",
    "cutmix",
    "stochastic_depth",
    "drop_path",
    "augment",
    "regulariz",
)


@dataclass(frozen=True)
class Dimension:
    """One declaration of a hyperparameter (a name may be declared once per `when`)."""

    name: str
    role: str
    type: str
    min: float | None = None
    max: float | None = None
    scale: str = "linear"
    values: tuple[Any, ...] = ()
    value: Any = None
    when: Mapping[str, Sequence[Any]] | None = None

    @property
    def label(self) -> str:
        """`learning_rate` or `learning_rate (optimizer=adam)` for a conditional declaration."""
        if not self.when:
            return self.name
        cond = ", ".join(f"{k}={'|'.join(map(str, v))}" for k, v in sorted(self.when.items()))
        return f"{self.name} ({cond})"

    @property
    def ordered(self) -> bool:
        """Whether values have an order, so a boundary can be checked."""
        return self.type in ("float", "int") or (self.type == "discrete" and len(self.values) > 1)

    @property
    def varied(self) -> bool:
        """Laid out by the quasi-random sequence (not crossed into arms, not fixed)."""
        if self.role == "fixed":
            return False
        return not (self.role == "scientific" and self.type in ("categorical", "discrete"))

    @cached_property
    def bounds(self) -> tuple[float | None, float | None]:
        """min and max in the scale's space (computed once; `unit` is called for every trial)."""
        if self.min is None or self.max is None:
            return None, None
        return _to_scale(self, self.min), _to_scale(self, self.max)

    def applies(self, arm: Mapping[str, Any]) -> bool:
        """Whether this declaration holds for an arm (its `when` matches the arm's values)."""
        return not self.when or all(arm.get(k) in list(v) for k, v in self.when.items())


def dimensions(spec: Mapping[str, Any]) -> list[Dimension]:
    """Every hyperparameter declaration of a stored spec, in spec order."""
    out = []
    for raw in spec.get("hyperparameters") or []:
        values = tuple(raw.get("values") or ())
        out.append(
            Dimension(
                name=str(raw["name"]),
                role=str(raw.get("role", "nuisance")),
                type=str(raw.get("type") or ("fixed" if raw.get("role") == "fixed" else "float")),
                min=_float(raw.get("min")),
                max=_float(raw.get("max")),
                scale=str(raw.get("scale") or "linear"),
                values=tuple(sorted(values)) if raw.get("type") == "discrete" else values,
                value=raw.get("value"),
                when=raw.get("when") or None,
            )
        )
    return out


def unit(dim: Dimension, value: Any) -> float | None:
    """Where `value` sits in the dimension's range, in its scale's space: 0 at min, 1 at max
    (outside [0, 1] when out of range). None for unordered or unusable values."""
    if dim.type == "discrete":
        return _discrete_unit(dim, value)
    if dim.min is None or dim.max is None or not isinstance(value, (int, float)) or isinstance(value, bool):
        return None
    lo, hi = dim.bounds
    x = _to_scale(dim, float(value))
    if lo is None or hi is None or x is None or hi == lo:
        return None
    return (x - lo) / (hi - lo)


def from_unit(dim: Dimension, u: float) -> float:
    """The value at unit position `u` (may lie outside [0, 1] to extrapolate the range)."""
    assert dim.min is not None and dim.max is not None
    lo, hi = _to_scale(dim, dim.min), _to_scale(dim, dim.max)
    assert lo is not None and hi is not None
    x = lo + u * (hi - lo)
    if dim.scale == "log":
        return math.exp(x)
    if dim.scale == "reverse_log":
        return 1.0 - math.exp(-x)
    return x


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


def is_regularizer(name: str) -> bool:
    """Whether a hyperparameter's name marks it as a regularization strength."""
    lowered = name.lower()
    return lowered in ("l2", "wd") or any(word in lowered for word in REGULARIZER_WORDS)


def is_learning_rate(name: str) -> bool:
    lowered = name.lower()
    return lowered in ("lr", "learning_rate", "base_learning_rate", "peak_learning_rate") or lowered.endswith(
        ("_lr", "learning_rate")
    )


def _to_scale(dim: Dimension, v: float) -> float | None:
    if dim.scale == "log":
        return math.log(v) if v > 0 else None
    if dim.scale == "reverse_log":
        return -math.log(1.0 - v) if v < 1 else None
    return v


def _discrete_unit(dim: Dimension, value: Any) -> float | None:
    try:
        index = list(dim.values).index(value)
    except ValueError:
        return None
    return index / (len(dim.values) - 1) if len(dim.values) > 1 else None


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


def _round_sig(x: float, digits: int = 3) -> float:
    if x == 0 or not math.isfinite(x):
        return x
    return round(x, digits - 1 - int(math.floor(math.log10(abs(x)))))


def _float(v: Any) -> float | None:
    return None if v is None else float(v)
