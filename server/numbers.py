"""Non-finite numbers as data: JSON has no NaN or infinity, so they travel as the strings
"NaN", "Infinity" and "-Infinity", and are stored as NULL plus a `NonFinite` flag."""

from __future__ import annotations

import enum
import math
from typing import Annotated, Any

from pydantic import BeforeValidator


class NonFinite(enum.IntEnum):
    """How a metric value that is not a finite number is kept (SQLite stores NaN as NULL)."""

    finite = 0
    nan = 1
    pos_inf = 2
    neg_inf = 3


_FROM_STRING = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def parse_number(value: float | str) -> float:
    """A float from a JSON number or one of the three strings; anything else is a ValueError."""
    if isinstance(value, str):
        try:
            return _FROM_STRING[value]
        except KeyError:
            raise ValueError('must be a number or one of "NaN", "Infinity", "-Infinity"') from None
    # bool is an int, and an object or a 400-digit integer must be a 422, not a TypeError's 500.
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError('must be a number or one of "NaN", "Infinity", "-Infinity"')
    try:
        return float(value)
    except OverflowError:
        raise ValueError("is too large for a double") from None


def to_storage(value: float) -> tuple[float | None, int]:
    """(value column, nonfinite column) for a float."""
    if math.isnan(value):
        return None, NonFinite.nan
    if math.isinf(value):
        return None, NonFinite.pos_inf if value > 0 else NonFinite.neg_inf
    return value, NonFinite.finite


def from_storage(value: float | None, nonfinite: int) -> float:
    if nonfinite == NonFinite.nan:
        return math.nan
    if nonfinite == NonFinite.pos_inf:
        return math.inf
    if nonfinite == NonFinite.neg_inf:
        return -math.inf
    return math.nan if value is None else value


def to_json(value: float | None) -> float | str | None:
    """A float for a JSON response: finite numbers as numbers, the rest as strings."""
    if value is None or math.isfinite(value):
        return value
    if math.isnan(value):
        return "NaN"
    return "Infinity" if value > 0 else "-Infinity"


def integral(value: Any) -> Any:
    return int(value) if isinstance(value, float) and value.is_integer() else value


# An integer field of a strict model: `7` and `7.0` (JSON Schema's integer, and what the trainer
# accepts) but never `"7"` or `true`. Optional ones write `Annotated[int, Field(...), INTEGRAL] |
# None`, so the bounds stay in the JSON schema.
INTEGRAL = BeforeValidator(integral)
Integer = Annotated[int, INTEGRAL]
