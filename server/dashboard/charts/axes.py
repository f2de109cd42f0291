"""The objective against each hyperparameter's axis (playbook, "Examining the search space
boundaries"), and parallel coordinates over all of them."""

from __future__ import annotations

import math
from typing import Any

from sqlalchemy.orm import Session

from hpo.server.analysis import load
from hpo.server.analysis.importance import holds_by_arm
from hpo.server.analysis.model import arm_label, fmt
from hpo.server.dashboard.charts.common import (
    axis_bounds,
    axis_type,
    hovers,
    objective_sign,
    original_trials,
    trial_summaries,
    worst_value,
)
from hpo.server.dashboard.charts.progress import thin
from hpo.server.space.search_space import dimensions

PARALLEL_LINES = 1000

# An axis chart draws one panel per varied hyperparameter (five in a two-arm study): 2,000 points
# each took 930 ms of a 5,000-trial study's 2.5 s first visit to draw; 1,000 show the same shape.
AXIS_POINTS = 1000


def axis_chart(session: Session, study: load.StudyInfo, _options: dict[str, Any]) -> dict[str, Any]:
    """One panel per varied hyperparameter (a conditional one per arm, labelled with it): the
    objective of each original trial by arm, infeasible trials as red crosses beyond the worst
    value, completed replicas marked (`replicas`, drawn hollow, as in the history chart), the
    searched bounds, log axes for log scales."""
    trials = original_trials(session, study.id)
    copies = [t for t in trial_summaries(session, study.id) if t.replica_of is not None and t.feasible]
    sign = objective_sign(study)
    drawn: set[int] = set()
    panels = []
    for dim in dimensions(study.spec):
        if not dim.varied:
            continue
        holds = holds_by_arm(dim, trials, copies)
        mine = [t for t in trials if dim.name in t.params and holds[t.arm_key]]
        twins = [t for t in copies if dim.name in t.params and holds[t.arm_key]]
        feasible = [t for t in mine if t.feasible]
        worst = worst_value([float(t.objective or 0.0) for t in feasible], study.mode)
        series: dict[str, dict[str, Any]] = {}
        shown = thin(feasible, sign, AXIS_POINTS)
        drawn.update(t.id for t in shown)
        for t in shown:
            s = series.setdefault(t.arm_key, {"name": arm_label(t.arm), "x": [], "y": [], "ids": []})
            s["x"].append(t.params[dim.name])
            s["y"].append(t.objective)
            s["ids"].append(t.id)
        bad_all = [t for t in mine if t.infeasible]
        bad = thin(bad_all, sign, AXIS_POINTS // 4)
        drawn.update(t.id for t in bad)
        panels.append(
            {
                "param": dim.label,
                "name": dim.name,
                "role": dim.role,
                "axis_type": axis_type(dim),
                "scale": dim.scale,
                "bounds": axis_bounds(dim),
                "categories": [str(v) for v in dim.values] if dim.type == "categorical" else None,
                "series": list(series.values()),
                "infeasible": {
                    "x": [t.params[dim.name] for t in bad],
                    "y": [worst] * len(bad),
                    "ids": [t.id for t in bad],
                },
                "shown": len(shown) + len(bad),
                "n_points": len(feasible) + len(bad_all),
                # completed replicas at their configuration's value, drawn hollow (as in history)
                "replicas": {
                    "x": [t.params[dim.name] for t in twins],
                    "y": [t.objective for t in twins],
                    "ids": [t.id for t in twins],
                },
            }
        )
    text = {**hovers([t for t in trials if t.id in drawn], study.metric), **hovers(copies, study.metric)}
    return {"panels": panels, "n_trials": len(trials), "n_replicas": len(copies), "text": text}


def parallel_chart(session: Session, study: load.StudyInfo, _options: dict[str, Any]) -> dict[str, Any]:
    """Feasible original trials as lines through one axis per varied hyperparameter and the
    objective; log scales as log10 with readable ticks, categories as indices with their names. A
    conditional hyperparameter is its own axis labelled with its arm; a trial of another arm
    crosses it at an `n/a` tick below its range. Each axis names its table column (`param`) and
    whether it is log10 (`log`), so brushing it can filter the trial table."""
    feasible = [t for t in original_trials(session, study.id) if t.feasible]
    # Each line costs the browser's WebGL; past PARALLEL_LINES, the best ones (where the questions are)
    trials = sorted(feasible, key=lambda t: objective_sign(study) * float(t.objective or 0.0))[:PARALLEL_LINES]
    dims = [d for d in dimensions(study.spec) if d.role != "fixed"]
    axes: list[dict[str, Any]] = []
    for dim in dims:
        values = [t.params.get(dim.name) if dim.applies(t.arm) else None for t in trials]
        if dim.when and all(v is None for v in values):
            continue  # no line crosses this arm's axis
        if dim.type == "categorical" or (dim.type == "discrete" and dim.role == "scientific"):
            names = [str(v) for v in dim.values]
            index = {n: i for i, n in enumerate(names)}
            axis = {
                "label": dim.label,
                "param": dim.label,
                "categorical": True,
                "values": [index.get(str(v)) if v is not None else None for v in values],
                "range": [0, max(len(names) - 1, 1)],
                "tickvals": list(range(len(names))),
                "ticktext": names,
            }
        elif dim.scale == "log":
            logs = [math.log10(v) if isinstance(v, (int, float)) and v > 0 else None for v in values]
            lo, hi = (math.log10(dim.min), math.log10(dim.max)) if dim.min and dim.max else (0.0, 1.0)
            ticks = list(range(math.floor(lo), math.ceil(hi) + 1))
            axis = {
                "label": f"{dim.label} (log)",
                "param": dim.label,
                "log": True,
                "values": logs,
                "range": [lo, hi],
                "tickvals": ticks,
                "ticktext": [f"1e{k}" for k in ticks],
            }
        else:
            axis = {"label": dim.label, "param": dim.label, "values": values, "range": axis_bounds(dim)}
        if dim.when:
            _not_applicable_below(axis)
        axes.append(axis)
    axes.append({"label": study.metric, "values": [t.objective for t in trials]})
    return {
        "axes": axes,
        "ids": [t.id for t in trials],
        "color": [t.objective for t in trials],
        "n": len(trials),
        "n_feasible": len(feasible),
    }


def _not_applicable_below(axis: dict[str, Any]) -> None:
    """Moves the trials where a conditional axis does not apply to an `n/a` tick just below its
    range (a parcoords line needs a value on every axis; pooling it into the range would lie)."""
    present = [float(v) for v in axis["values"] if v is not None]
    lo, hi = axis.get("range") or ([min(present), max(present)] if present else [0.0, 1.0])
    span = (hi - lo) or abs(hi) or 1.0
    at = lo - 0.12 * span
    axis["values"] = [at if v is None else v for v in axis["values"]]
    axis["range"] = [at, hi]
    if "tickvals" not in axis:
        ticks = [lo + k * (hi - lo) / 4 for k in range(5)]
        axis["tickvals"], axis["ticktext"] = ticks, [fmt(v) for v in ticks]
    axis["tickvals"] = [at, *axis["tickvals"]]
    axis["ticktext"] = ["n/a", *axis["ticktext"]]
    axis["not_applicable_at"] = at
