"""What several chart families share: the constants that bound a chart's size, a study's trials as
the charts read them, hover text, the objective's sign, and axis types and ranges."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from sqlalchemy.orm import Session

from hpo.server.analysis import load
from hpo.server.analysis.judged import load_trials
from hpo.server.analysis.model import TrialSummary, fmt
from hpo.server.space.search_space import Dimension, dimensions


def trial_summaries(session: Session, study_id: int) -> list[TrialSummary]:
    """The analysis' own trial summaries (`divergence.load_trials`): the same trials judged
    diverged (drawn as infeasible) and the same best trials as the analysis and the PNG plots,
    shared by the charts of one study version (kept in `memo`)."""
    trials, _ = load_trials(session, load.study_info(session, study_id))
    return trials


def hover(t: TrialSummary, metric: str) -> str:
    """`trial 12<br>lr=0.01, wd=1e-4<br>valid/error = 0.21` for a point of trial 12 (trials are
    named by their id everywhere, the id of their URL; a replica says which trial it repeats)."""
    params = ", ".join(f"{k}={fmt(v)}" for k, v in t.params.items())
    value = f"{metric} = {fmt(t.objective)}" if t.feasible else t.status + (f" ({t.fail_kind})" if t.fail_kind else "")
    copy = f" (replica of trial {t.replica_of})" if t.replica_of is not None else ""
    return f"trial {t.id}{copy}<br>{params}<br>{value}"


def hovers(trials: Sequence[TrialSummary], metric: str) -> dict[str, str]:
    """Hover text by trial id, sent once per chart (the points carry only ids)."""
    return {str(t.id): hover(t, metric) for t in trials}


def original_trials(session: Session, study_id: int) -> list[TrialSummary]:
    return [t for t in trial_summaries(session, study_id) if t.replica_of is None]


def objective_sign(study: load.StudyInfo) -> float:
    return 1.0 if study.mode == "min" else -1.0


def worst_value(values: Sequence[float], mode: str) -> float:
    """Where infeasible trials are drawn: just beyond the worst feasible value."""
    if not values:
        return 1.0
    span = (max(values) - min(values)) or abs(max(values)) or 1.0
    return max(values) + 0.08 * span if mode == "min" else min(values) - 0.08 * span


def axis_type(dim: Dimension) -> str:
    if dim.type == "categorical":
        return "category"
    return "log" if dim.scale == "log" else "linear"


def axis_bounds(dim: Dimension) -> list[Any] | None:
    if dim.type == "discrete" and dim.values:
        return [min(dim.values), max(dim.values)]
    if dim.min is not None and dim.max is not None:
        return [dim.min, dim.max]
    return None


def numeric_dims(study: load.StudyInfo) -> list[Dimension]:
    return [d for d in dimensions(study.spec) if d.varied and d.type in ("float", "int", "discrete")]


def robust_range(values: np.ndarray, log: bool) -> list[float] | None:
    """Axis limits that hold the bulk of the values: Tukey's fences (3 IQR beyond the quartiles),
    in log10 space for log axes (Plotly's log-axis ranges are log10 too), clamped to the data."""
    v = values[np.isfinite(values)]
    if log:
        v = np.log10(v[v > 0])
    if not len(v):
        return None
    q1, q3 = np.percentile(v, [25, 75])
    iqr = q3 - q1
    lo, hi = max(float(v.min()), q1 - 3 * iqr), min(float(v.max()), q3 + 3 * iqr)
    pad = (hi - lo) * 0.05 or (0.1 if log else abs(hi) * 0.05 or 0.1)
    return [lo - pad, hi + pad]
