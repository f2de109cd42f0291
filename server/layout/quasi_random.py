"""Trial layout (docs/spec.md, "Roles" and "Algorithms"): arms crossed from the scientific values, one
quasi-random dimension per varied name, unit points mapped through each declaration's range.

Pure and resumable, like Vizier's quasi-random designer: trials for points `start … start+count-1`
depend only on the spec, its seed and the point index, so raising `num_trials` continues the
sequence and nothing already laid out changes. The playbook prefers quasi-random search in the
exploration phase ("Why use quasi-random search instead of more sophisticated black box
optimization algorithms during the exploration phase of tuning?")."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy.stats import qmc

from hpo.server.space.dimension import map_unit
from hpo.server.spec.model import Hyperparameter, StudySpec, crossed_arms, sampled_names


@dataclass(frozen=True)
class TrialDraft:
    """A trial before it is stored: `unit_point` is the record the params were mapped from."""

    arm: dict[str, Any]
    params: dict[str, Any]
    point_index: int | None
    unit_point: list[float] | None
    seed: int
    replica_index: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


def arms(spec: StudySpec) -> list[dict[str, Any]]:
    """The crossing of the categorical/discrete scientific values; `[{}]` when there is none."""
    return crossed_arms(spec)


def dimensions(spec: StudySpec) -> list[str]:
    """One quasi-random dimension per distinct varied name that is not crossed, ordered by name
    (continuous scientific hyperparameters join the nuisance ones)."""
    return sampled_names(spec)


def trial_seed(study_seed: int, point_index: int, replica_index: int = 0) -> int:
    """The training seed of a point: arms at the same point share it (a paired comparison), a
    retry keeps it, a replica gets a new one. 31 bits, so every framework accepts it."""
    state = np.random.SeedSequence([study_seed, point_index, replica_index]).generate_state(1, dtype=np.uint64)
    return int(state[0]) & (2**31 - 1)


def layout_trials(spec: StudySpec, start_index: int, count: int) -> list[TrialDraft]:
    """Drafts for points `start_index … start_index+count-1`, each crossed with every arm (arm-major
    within a point). A grid yields fewer drafts past its last point."""
    if count <= 0:
        return []
    return _drafts_at(spec, start_index, _unit_points(spec, start_index, count))


# Hyperparameter values per chunk of `layout_chunks`: a few megabytes of drafts at a time.
CHUNK_VALUES = 50_000


def layout_chunks(spec: StudySpec, start_index: int, count: int) -> Iterator[list[TrialDraft]]:
    """`layout_trials(spec, start_index, count)` a chunk of points at a time (the same drafts in
    the same order: one Halton sampler draws them in turn), each chunk about `CHUNK_VALUES`
    hyperparameter values, so a caller storing each chunk holds one at a time."""
    per_point = len(arms(spec)) * max(1, len(spec.hyperparameters))
    step = max(1, CHUNK_VALUES // per_point)
    sampler = _halton(spec, start_index)
    for chunk in range(start_index, start_index + count, step):
        drafts = _drafts_at(spec, chunk, _unit_points(spec, chunk, min(step, start_index + count - chunk), sampler))
        if not drafts:
            return  # a grid past its last point
        yield drafts


def _drafts_at(spec: StudySpec, start_index: int, points: list[list[float]]) -> list[TrialDraft]:
    names = dimensions(spec)
    # Which declarations apply to each arm is the same at every point: work it out once.
    per_arm = [(arm, [hp for hp in spec.hyperparameters if not hp.crossed and hp.holds(arm)]) for arm in arms(spec)]
    drafts = []
    for offset, unit in enumerate(points):
        index = start_index + offset
        seed = trial_seed(spec.seed, index)
        position = dict(zip(names, unit, strict=True))
        for arm, declarations in per_arm:
            drafts.append(TrialDraft(arm, _params_at(arm, declarations, position), index, unit, seed))
    return drafts


def resolve_params(spec: StudySpec, arm: dict[str, Any], unit: list[float]) -> dict[str, Any]:
    """Every hyperparameter for an arm at a unit point: scientific (the arm's values), sampled
    ones, fixed ones; a conditional one only where its `when` holds. Every declaration of a name
    maps the same unit value through its own range."""
    declarations = [hp for hp in spec.hyperparameters if not hp.crossed and hp.holds(arm)]
    return _params_at(arm, declarations, dict(zip(dimensions(spec), unit, strict=True)))


def _params_at(arm: dict[str, Any], declarations: list[Hyperparameter], position: dict[str, float]) -> dict[str, Any]:
    params: dict[str, Any] = dict(arm)
    for hp in declarations:
        params[hp.name] = hp.value if hp.role == "fixed" else map_unit(hp, position[hp.name])
    return params


def _unit_points(spec: StudySpec, start: int, count: int, sampler: qmc.Halton | None = None) -> list[list[float]]:
    """The unit points `start … start+count-1`; `sampler` (from `_halton`, already at `start`)
    continues a Halton sequence instead of scrambling a new one (for d = 1,000 a new one costs more
    than a thousand points)."""
    d = len(dimensions(spec))
    if spec.algorithm == "grid":
        return _grid_points(spec, start, count)
    if d == 0:
        return [[] for _ in range(count)]
    if spec.algorithm == "random":
        return [np.random.default_rng([spec.seed, start + i]).random(d).tolist() for i in range(count)]
    if sampler is None:
        sampler = _halton(spec, start)
    assert sampler is not None
    return [[float(u) for u in row] for row in sampler.random(count)]


def _halton(spec: StudySpec, start: int) -> qmc.Halton | None:
    """The study's scrambled Halton sampler at point `start` (None where the layout is not Halton)."""
    d = len(dimensions(spec))
    if spec.algorithm in ("grid", "random") or d == 0:
        return None
    sampler = qmc.Halton(d, scramble=True, seed=spec.seed)
    if start:
        sampler.fast_forward(start)
    return sampler


def grid_axes(spec: StudySpec) -> list[list[float]]:
    """The unit values of each grid dimension. Categorical and discrete dimensions take all their
    values (cell centres); continuous ones take `num_trials` evenly spaced values in the space of
    their scale for one dimension, and ceil(sqrt(num_trials)) each for two."""
    names = dimensions(spec)
    per_axis = spec.num_trials if len(names) <= 1 else math.ceil(math.sqrt(spec.num_trials))
    axes = []
    for name in names:
        hp = spec.declarations(name)[0]
        k = len(hp.values or []) if hp.type in ("categorical", "discrete") else per_axis
        if hp.type == "int":
            k = min(k, int((hp.max or 0) - (hp.min or 0)) + 1)
        axes.append(
            [(i + 0.5) / k for i in range(k)]
            if hp.type in ("categorical", "discrete", "int")
            else ([0.5] if k == 1 else [i / (k - 1) for i in range(k)])
        )
    return axes


def _grid_points(spec: StudySpec, start: int, count: int) -> list[list[float]]:
    axes = grid_axes(spec)
    total = math.prod(len(a) for a in axes) if axes else 1
    points = []
    for index in range(start, min(start + count, total)):
        point, rest = [], index
        for axis in reversed(axes):
            rest, position = divmod(rest, len(axis))
            point.append(axis[position])
        points.append(list(reversed(point)))
    return points
