"""One declaration of a hyperparameter as a dimension of the unit cube: the value a unit coordinate
maps to, the coordinate a value maps back to, and whether a value fits the declaration at all.

Ranges (float, int) map through their scale (`scales`); categorical and discrete values each own
an equal cell of the unit interval (value i of k is the cell [i/k, (i+1)/k)), and so does each
whole number of an int range (docs/bayesian.md: proposals are snapped to a cell's centre)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from hpo.server.space import scales

# The types whose values are listed (cells of the unit interval), not given as a range.
CELL_TYPES = ("categorical", "discrete")


class Declaration(Protocol):
    """What the mapping reads of a declaration (the spec's `Hyperparameter` is one)."""

    @property
    def name(self) -> str: ...
    @property
    def type(self) -> str | None: ...
    @property
    def scale(self) -> str: ...
    @property
    def min(self) -> float | None: ...
    @property
    def max(self) -> float | None: ...
    @property
    def values(self) -> Sequence[Any] | None: ...


def value_key(value: Any) -> tuple[str, Any]:
    """A comparison key that keeps booleans apart from numbers (`True == 1` in Python) and lets
    `2 == 2.0`; used wherever a value is looked up among declared values."""
    if isinstance(value, bool):
        return ("bool", value)
    if isinstance(value, (int, float)):
        return ("number", float(value))
    return (type(value).__name__, value)


def contains(values: Iterable[Any], value: Any) -> bool:
    """Whether `value` is one of `values`, compared by `value_key`."""
    key = value_key(value)
    return any(value_key(v) == key for v in values)


def map_unit(hp: Declaration, u: float) -> Any:
    """A unit value in [0, 1) to a value of the declaration, in the space of its scale."""
    if hp.type in CELL_TYPES:
        values = hp.values or []
        return values[min(int(math.floor(u * len(values))), len(values) - 1)]
    low, high = float(hp.min or 0.0), float(hp.max or 0.0)
    if hp.type == "int":
        low, high = _int_range(hp.scale, low, high)
        return int(min(max(round(scales.from_unit(hp.scale, low, high, u)), hp.min or 0), hp.max or 0))
    # exp(log(max)) can land an ulp past max (0.1 -> 0.10000000000000006): a value outside the
    # declared range, which the spec's own checks (and the designer's snapping) would refuse.
    return min(max(scales.from_unit(hp.scale, low, high, u), low), high)


def to_unit(hp: Declaration, value: Any) -> float:
    """The unit coordinate `map_unit` maps to `value` (the centre of its cell for categorical,
    discrete and whole-number values): the inverse used to snap proposals and to place warm-start
    trials. NaN when the value is not in the declaration's space."""
    if hp.type in CELL_TYPES:
        keys = [value_key(v) for v in hp.values or []]
        key = value_key(value)
        return (keys.index(key) + 0.5) / len(keys) if key in keys else math.nan
    low, high = float(hp.min or 0.0), float(hp.max or 0.0)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= float(value) <= high:
        return math.nan
    if hp.type == "int":
        low, high = _int_range(hp.scale, low, high)
        # The cell of a whole number v is where the scaled value rounds to v: its centre is the
        # midpoint of the unit values of v - 0.5 and v + 0.5 (clipped to the range).
        lo = scales.to_unit(hp.scale, low, high, max(float(value) - 0.5, low))
        hi = scales.to_unit(hp.scale, low, high, min(float(value) + 0.5, high))
        return (lo + hi) / 2
    return scales.to_unit(hp.scale, low, high, float(value))


def outside_reason(hp: Declaration, value: Any) -> str | None:
    """Why `value` is not in the declaration's space, or None when it is."""
    if hp.type in CELL_TYPES:
        return None if contains(hp.values or [], value) else f"must be one of {hp.values}, not {value!r}"
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return f"must be a finite number, not {value!r}"
    if hp.type == "int" and not float(value).is_integer():
        return f"must be a whole number, not {value!r}"
    if not (hp.min is not None and hp.max is not None and hp.min <= value <= hp.max):
        return f"must be within [{hp.min}, {hp.max}], not {value!r}"
    return None


def _int_range(scale: str, low: float, high: float) -> tuple[float, float]:
    # Draw over [min - 0.5, max + 0.5] so the end values are as likely as the inner ones (on a log
    # scale no lower than min / 2, which stays above 0).
    return (low - 0.5, high + 0.5) if scale == "linear" else (max(low - 0.5, low / 2), high + 0.5)
