"""The objective over two hyperparameters at a time, interpolated on a grid, within one arm."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from sqlalchemy.orm import Session

from hpo.server.analysis import load
from hpo.server.analysis.importance import holds_by_arm
from hpo.server.analysis.model import arm_label
from hpo.server.dashboard.charts.common import axis_type, hovers, numeric_dims, objective_sign, original_trials
from hpo.server.dashboard.charts.progress import THIN_POINTS, thin
from hpo.server.errors import InvalidInput
from hpo.server.space.search_space import Dimension, dimensions

# The contour's markers (its surface is interpolated over every trial).
CONTOUR_POINTS = THIN_POINTS


def contour_chart(session: Session, study: load.StudyInfo, options: dict[str, Any]) -> dict[str, Any]:
    """The objective over a pair of numeric hyperparameters (`x`, `y` options, each a label or an
    unambiguous name; the first valid pair by default), optionally within one `arm`, interpolated
    linearly between the trials on a 40 x 40 grid, with the trials on top. Conditional
    hyperparameters are their own dimensions: a pair never defined in the same trials (Adam's and
    Nesterov's learning rates) is refused, never pooled on one axis. `pairs` lists, for each
    choice, the choices it can be drawn against."""
    arm = options.get("arm") or None
    trials = [t for t in original_trials(session, study.id) if t.feasible]
    labels = sorted({arm_label(t.arm) for t in original_trials(session, study.id)})
    if arm is not None:
        if arm not in labels:
            raise InvalidInput.one("arm", f"{arm!r} is not an arm of this study; arms: {labels}")
        trials = [t for t in trials if arm_label(t.arm) == arm]
    arms = [a for a in queries_arms(study) if arm is None or arm_label(a) == arm]
    dims = {d.label: d for d in numeric_dims(study) if any(d.applies(a) for a in arms)}
    pairs = {x: [y for y, dy in dims.items() if y != x and _share_an_arm(dx, dy, arms)] for x, dx in dims.items()}
    x_label = _choice(dims, "x", options.get("x"), arm)
    if x_label is None:
        x_label = next((c for c in dims if pairs[c]), None)
    y_label = _choice(dims, "y", options.get("y"), arm)
    if y_label is None and x_label is not None:
        y_label = next(iter(pairs[x_label]), None)
    base: dict[str, Any] = {
        "choices": list(dims),
        "pairs": pairs,
        "x": x_label,
        "y": y_label,
        "arm": arm,
        "arms": labels,
    }
    if x_label is None or y_label is None or x_label == y_label:
        return {**base, "grid": None, "points": None, "message": "needs two different varied numeric hyperparameters"}
    dx, dy = dims[x_label], dims[y_label]
    if y_label not in pairs[x_label]:
        raise InvalidInput.one(
            "y",
            f"{x_label!r} and {y_label!r} are never defined in the same trials (their arms differ): "
            f"draw {x_label!r} against one of {pairs[x_label]}",
        )
    hx, hy = holds_by_arm(dx, trials), holds_by_arm(dy, trials)
    trials = [t for t in trials if hx[t.arm_key] and hy[t.arm_key] and dx.name in t.params and dy.name in t.params]
    xs = np.array([float(t.params[dx.name]) for t in trials])
    ys = np.array([float(t.params[dy.name]) for t in trials])
    zs = np.array([float(t.objective or 0.0) for t in trials])
    grid = _grid(xs, ys, zs, dx.scale == "log", dy.scale == "log") if len(trials) >= 4 else None
    # The surface is interpolated over every trial; the markers on top are thinned like the history
    # chart's (23,000 markers of a 50,000-trial study were 4 MB and a 2.2 s WebGL draw).
    shown = thin(trials, objective_sign(study), CONTOUR_POINTS)
    points = {
        "x": [float(t.params[dx.name]) for t in shown],
        "y": [float(t.params[dy.name]) for t in shown],
        "ids": [t.id for t in shown],
    }
    return {
        **base,
        "x_type": axis_type(dx),
        "y_type": axis_type(dy),
        "points": points,
        "text": hovers(shown, study.metric),
        "shown": len(shown),
        "n_points": len(trials),
        "grid": grid,
        "message": None if grid else "fewer than 4 completed trials with both hyperparameters",
    }


def queries_arms(study: load.StudyInfo) -> list[dict[str, Any]]:
    """Every arm the spec crosses (its scientific categorical and discrete values), `[{}]` for a
    study without arms."""
    crossed = [d for d in dimensions(study.spec) if d.role == "scientific" and d.type in ("categorical", "discrete")]
    arms: list[dict[str, Any]] = [{}]
    for d in crossed:
        arms = [{**a, d.name: v} for a in arms for v in d.values]
    return arms


def _share_an_arm(a: Dimension, b: Dimension, arms: Sequence[Mapping[str, Any]]) -> bool:
    return any(a.applies(arm) and b.applies(arm) for arm in arms)


def _choice(dims: Mapping[str, Dimension], field: str, wanted: Any, arm: str | None) -> str | None:
    """The label `wanted` names: a label, or a name declared once among `dims` (a 422 otherwise)."""
    if not wanted:
        return None
    if wanted in dims:
        return str(wanted)
    named = [label for label, d in dims.items() if d.name == wanted]
    if len(named) == 1:
        return named[0]
    where = f" in arm {arm!r}" if arm else ""
    if named:
        raise InvalidInput.one(field, f"{wanted!r} is declared per arm{where}: choose one of {named}")
    raise InvalidInput.one(field, f"{wanted!r} is not a varied numeric hyperparameter{where}; choose from {list(dims)}")


def _grid(xs: np.ndarray, ys: np.ndarray, zs: np.ndarray, xlog: bool, ylog: bool, n: int = 40) -> dict[str, Any] | None:
    from scipy.interpolate import griddata  # scipy.interpolate loads only for a contour

    tx = np.log10(xs) if xlog else xs
    ty = np.log10(ys) if ylog else ys
    if np.ptp(tx) == 0 or np.ptp(ty) == 0:
        return None
    gx, gy = np.linspace(tx.min(), tx.max(), n), np.linspace(ty.min(), ty.max(), n)
    try:
        gz = griddata((tx, ty), zs, tuple(np.meshgrid(gx, gy)), method="linear")
    except Exception:  # a degenerate layout (all points on a line): no surface, the points remain
        return None
    return {
        "x": (10**gx if xlog else gx).tolist(),
        "y": (10**gy if ylog else gy).tolist(),
        "z": [[None if not math.isfinite(v) else float(v) for v in row] for row in gz],
    }
