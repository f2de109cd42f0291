"""What `algorithm: "bayesian"` accepts, and the arm's search space the designer models.

Decisions (docs/bayesian.md):
- Scientific hyperparameters must be categorical or discrete: their values are crossed into arms as
  in every study, and each arm gets its own model and `num_trials` trials, so the nuisance
  hyperparameters are optimized separately for each scientific value (the playbook's fair
  comparison, "Identifying scientific, nuisance, and fixed hyperparameters"). A continuous
  scientific hyperparameter is refused: the optimizer would go where the objective is best instead
  of covering the values to compare; make it nuisance, or list the values to compare as discrete.
- Each distinct varied name is one dimension of the unit cube the layout already defines (so a
  conditional name is modelled only in the arms where its `when` holds); categorical values keep
  the layout's unit-interval cells (value i is the cell [i/k, (i+1)/k)), and proposals are snapped
  to a cell's centre, as whole numbers are.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ..errors import FieldError
from ..layout import map_unit
from ..spec import Hyperparameter, StudySpec, sampled_names

# Below about two observations per dimension (and never under five) a GP's hyperparameters are
# mostly prior: Ax's and Optuna's GP sampler's quasi-random start is of this size.
MIN_INITIAL = 5
INITIAL_PER_DIMENSION = 2


def spec_errors(spec: StudySpec) -> Iterator[FieldError]:
    """Why a spec is not a valid bayesian study (nothing when it is)."""
    if spec.algorithm != "bayesian":
        yield FieldError("bayesian", f'is only for algorithm "bayesian", not {spec.algorithm!r}')
        return
    for index, hp in enumerate(spec.hyperparameters):
        if hp.role == "scientific" and hp.type in ("float", "int"):
            yield FieldError(
                f"hyperparameters[{index}].role",
                f"a bayesian study cannot compare values of the continuous scientific {hp.name!r}: it optimizes over "
                "what it searches; make it nuisance, or list the values to compare (type discrete) as arms",
            )
    if not sampled_names(spec):
        yield FieldError("hyperparameters", "a bayesian study needs at least one nuisance hyperparameter to optimize")
    settings = spec.bayesian
    if settings is not None and settings.initial_trials is not None and settings.initial_trials > spec.num_trials:
        yield FieldError(
            "bayesian.initial_trials", f"must be at most num_trials ({settings.initial_trials} > {spec.num_trials})"
        )


def initial_trials(spec: StudySpec, warm_observations: int = 0) -> int:
    """Quasi-random (Halton) trials per arm before the model proposes: the spec's
    `bayesian.initial_trials`, else max(5, 2 x dimensions) less the warm-start observations."""
    settings = spec.bayesian
    if settings is not None and settings.initial_trials is not None:
        return settings.initial_trials
    wanted = max(MIN_INITIAL, INITIAL_PER_DIMENSION * len(sampled_names(spec)))
    return min(spec.num_trials, max(0, wanted - warm_observations))


def queue_size(spec: StudySpec) -> int:
    return spec.bayesian.queue_size if spec.bayesian is not None else 2


@dataclass(frozen=True)
class ArmSpace:
    """The dimensions modelled for one arm: `columns[i]` indexes the study's unit point, whose
    declaration for this arm is `declarations[i]`. Picklable; `snap` rounds a point of this space."""

    arm: dict[str, Any]
    width: int
    columns: list[int]
    declarations: list[Hyperparameter]

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


def arm_space(spec: StudySpec, arm: dict[str, Any]) -> ArmSpace:
    names = sampled_names(spec)
    columns, declarations = [], []
    for column, name in enumerate(names):
        held = [hp for hp in spec.declarations(name) if hp.sampled and hp.holds(arm)]
        if held:
            columns.append(column)
            declarations.append(held[0])
    return ArmSpace(arm=arm, width=len(names), columns=columns, declarations=declarations)


def to_unit(hp: Hyperparameter, value: Any) -> float:
    """The unit coordinate `map_unit` maps to `value` (the centre of its cell for categorical,
    discrete and whole-number values): the inverse used to snap proposals and to place warm-start
    trials. NaN when the value is not in the declaration's space."""
    if hp.type in ("categorical", "discrete"):
        from ..spec import value_key

        keys = [value_key(v) for v in hp.values or []]
        key = value_key(value)
        return (keys.index(key) + 0.5) / len(keys) if key in keys else math.nan
    low, high = float(hp.min or 0.0), float(hp.max or 0.0)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= float(value) <= high:
        return math.nan
    if hp.type == "int":
        low, high = (low - 0.5, high + 0.5) if hp.scale == "linear" else (max(low - 0.5, low / 2), high + 0.5)
        # The cell of a whole number v is where the scaled value rounds to v: its centre is the
        # midpoint of the unit values of v - 0.5 and v + 0.5 (clipped to the range).
        lo = _unscaled(hp.scale, low, high, max(float(value) - 0.5, low))
        hi = _unscaled(hp.scale, low, high, min(float(value) + 0.5, high))
        return (lo + hi) / 2
    return _unscaled(hp.scale, low, high, float(value))


def _unscaled(scale: str, low: float, high: float, value: float) -> float:
    if scale == "log":
        u = (math.log(value) - math.log(low)) / (math.log(high) - math.log(low))
    elif scale == "reverse_log":
        u = 1.0 - (math.log(1.0 - value) - math.log(1.0 - high)) / (math.log(1.0 - low) - math.log(1.0 - high))
    else:
        u = (value - low) / (high - low)
    return min(max(u, 0.0), 1.0)
