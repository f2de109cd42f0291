"""The search space read from a study's stored spec as plain data: the analysis' `Dimension` view
of each declaration, and the bayesian designer's `ArmSpace` (the dimensions modelled for one arm).

The analysis measures positions in the space of each hyperparameter's scale (a unit value in
[0, 1], the same scales the Halton layout uses), so "near the edge" means the same thing for a
log-scaled learning rate and a linear dropout rate."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from hpo.server.space.dimension import Declaration, map_unit, to_unit
from hpo.server.space.scales import from_scale, to_scale

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
        return to_scale(self.scale, self.min), to_scale(self.scale, self.max)

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
    x = to_scale(dim.scale, float(value))
    if lo is None or hi is None or x is None or hi == lo:
        return None
    return (x - lo) / (hi - lo)


def from_unit(dim: Dimension, u: float) -> float:
    """The value at unit position `u` (may lie outside [0, 1] to extrapolate the range)."""
    lo, hi = dim.bounds
    assert lo is not None and hi is not None
    return from_scale(dim.scale, lo + u * (hi - lo))


def is_regularizer(name: str) -> bool:
    """Whether a hyperparameter's name marks it as a regularization strength."""
    lowered = name.lower()
    return lowered in ("l2", "wd") or any(word in lowered for word in REGULARIZER_WORDS)


def is_learning_rate(name: str) -> bool:
    """Whether a hyperparameter's name marks it as the learning rate."""
    lowered = name.lower()
    return lowered in ("lr", "learning_rate", "base_learning_rate", "peak_learning_rate") or lowered.endswith(
        ("_lr", "learning_rate")
    )


def _discrete_unit(dim: Dimension, value: Any) -> float | None:
    try:
        index = list(dim.values).index(value)
    except ValueError:
        return None
    return index / (len(dim.values) - 1) if len(dim.values) > 1 else None


def _float(v: Any) -> float | None:
    return None if v is None else float(v)


@dataclass(frozen=True)
class ArmSpace:
    """The dimensions the bayesian designer models for one arm: `columns[i]` indexes the study's
    unit point, whose declaration for this arm is `declarations[i]`. Picklable; `snap` rounds a
    point of this space to the centre of its cells (docs/bayesian.md)."""

    arm: dict[str, Any]
    width: int
    columns: list[int]
    declarations: Sequence[Declaration]

    def project(self, unit: list[float]) -> list[float]:
        return [float(unit[c]) for c in self.columns]

    def embed(self, point: list[float]) -> list[float]:
        """A full unit point: the arm's coordinates, 0.5 where a name does not apply to the arm."""
        full = [0.5] * self.width
        for column, u in zip(self.columns, point, strict=True):
            full[column] = u
        return full

    def snap(self, point: list[float]) -> list[float]:
        return [to_unit(hp, map_unit(hp, u)) for hp, u in zip(self.declarations, point, strict=True)]

    @property
    def names(self) -> list[str]:
        return [hp.name for hp in self.declarations]
