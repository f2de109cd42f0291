"""Which hyperparameters matter: a random forest's permutation importance per arm, kept in memory
per study version. The dashboard draws it and the exploit recipe refines a space by it."""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
from sqlalchemy.orm import Session

from hpo.server.analysis import load
from hpo.server.analysis.judged import load_trials
from hpo.server.analysis.model import TrialSummary, arm_label
from hpo.server.errors import InvalidInput
from hpo.server.space.search_space import Dimension, dimensions

_IMPORTANCE_CACHE: dict[tuple[int, str], dict[str, Any]] = {}

_IMPORTANCE_LOCK = threading.Lock()

IMPORTANCE_METHOD = (
    "permutation importance of a random forest (scikit-learn RandomForestRegressor, 32 trees): how much the "
    "forest's R² drops when one hyperparameter's values are shuffled; a conditional hyperparameter is "
    "shuffled within the trials where it applies, its drop measured against the whole study's variance"
)


def study_importance(session: Session, study: load.StudyInfo, arm: str | None = None) -> dict[str, Any]:
    """Which hyperparameters the objective depends on, over the completed original trials (of one
    `arm` when asked), conditional ones included as their own dimensions (`importance_by_dim`);
    cached per study and arm until a trial finishes (the forests cost a few hundred milliseconds on
    thousands of trials)."""
    judged, _ = load_trials(session, study)
    trials = [t for t in judged if t.feasible and t.replica_of is None]
    labels = sorted({arm_label(a) for a in {t.arm_key: t.arm for t in trials}.values()})
    if arm is not None:
        if arm not in labels:
            raise InvalidInput.one("arm", f"{arm!r} is not an arm with completed trials; arms: {labels}")
        trials = [t for t in trials if arm_label(t.arm) == arm]
    dims = [d for d in dimensions(study.spec) if d.role != "fixed"]
    key = (study.id, f"{arm}:{len(trials)}:{max((t.id for t in trials), default=0)}")
    with _IMPORTANCE_LOCK:
        cached = _IMPORTANCE_CACHE.get(key)
    if cached is not None:
        return cached
    answer = {**importance_by_dim(dims, trials), "arm": arm, "arms": labels}
    with _IMPORTANCE_LOCK:
        if len(_IMPORTANCE_CACHE) > 64:
            _IMPORTANCE_CACHE.clear()
        _IMPORTANCE_CACHE[key] = answer
    return answer


def importance_by_dim(dims: Sequence[Dimension], trials: Sequence[TrialSummary]) -> dict[str, Any]:
    """Importance of every declaration, conditional ones included (docs/spec.md: conditional
    hyperparameters are separate dimensions, labelled with their arm): the unconditional ones over
    all `trials`, each group of declarations sharing a `when` over the trials where it applies
    (with the unconditional ones beside it, so it competes with them there). `learning_rate` under
    Adam and under Nesterov are two entries, `learning_rate (optimizer=adam)` and
    `learning_rate (optimizer=nesterov)`, each with the number of trials it was computed on."""
    plain = [d for d in dims if not d.when or all(holds_by_arm(d, trials).values())]
    groups: dict[str, list[Dimension]] = {}
    for d in dims:
        if d not in plain:
            groups.setdefault(json.dumps(d.when, sort_keys=True, default=str), []).append(d)
    answer = importance(plain, trials)
    params = [{**p, "n": len(trials)} for p in answer["params"]]
    variance = float(np.var([float(t.objective or 0.0) for t in trials])) if trials else None
    for group in groups.values():
        holds = holds_by_arm(group[0], trials)
        mine = [t for t in trials if holds[t.arm_key]]
        sub = importance([*plain, *group], mine, variance=variance)
        wanted = {d.label for d in group}
        params += [{**p, "n": len(mine)} for p in sub["params"] if p["name"] in wanted]
    params.sort(key=lambda p: (-p["importance"], p["name"]))
    out = {**answer, "params": params}
    if params:
        out.pop("message", None)
    elif groups and "message" not in out:
        out["message"] = "needs at least 8 completed trials where each hyperparameter applies"
    return out


def preload() -> None:
    """Imports what `importance` needs (0.5-1.7 s of CPU), at server start before it answers."""
    import sklearn.ensemble  # noqa: F401


def importance(
    dims: Sequence[Dimension], trials: Sequence[TrialSummary], max_rows: int = 1000, variance: float | None = None
) -> dict[str, Any]:
    """`{method, n, params: [{name, param, when, importance, std}]}`, most important first (`name`
    is the dimension's label, `param` its name in the trials' params); importances are the mean
    drop in R² (clipped at 0) over 5 shuffles: the rise in the forest's squared error over the
    objective's `variance` (by default over `trials`; a subset's importances are measured against
    the whole study's variance so that they compare with the others). Needs 8 completed trials."""
    base: dict[str, Any] = {"method": IMPORTANCE_METHOD, "n": len(trials), "params": []}
    varied = [d for d in dims if _varies(d.name, trials)]
    if len(trials) < 8 or not varied:
        return {**base, "message": "needs at least 8 completed trials and a hyperparameter that varies"}
    from sklearn.ensemble import RandomForestRegressor  # heavy: loaded at server start by preload()

    rng = np.random.default_rng(0)
    rows = list(trials) if len(trials) <= max_rows else [trials[i] for i in rng.choice(len(trials), max_rows, False)]
    columns = []
    for dim in varied:
        raw = [t.params.get(dim.name) for t in rows]
        if dim.type == "categorical":
            codes = {v: i for i, v in enumerate(sorted({str(v) for v in raw}))}
            columns.append([float(codes[str(v)]) for v in raw])
        else:
            values = [float(v) if isinstance(v, (int, float)) else math.nan for v in raw]
            columns.append([math.log10(v) if dim.scale == "log" and v > 0 else v for v in values])
    x = np.nan_to_num(np.array(columns).T, nan=-1.0)
    y = np.array([float(t.objective or 0.0) for t in rows])
    forest = RandomForestRegressor(n_estimators=32, min_samples_leaf=2, random_state=0, n_jobs=1).fit(x, y)
    sample = rng.choice(len(rows), min(len(rows), 300), replace=False)
    rises = _permutation_rises(forest, x[sample], y[sample], rng)
    scale = variance if variance is not None else float(np.var(y))
    scale = scale if scale > 0 else 1.0
    params = [
        {
            "name": dim.label,
            "param": dim.name,
            "when": dim.when,
            "importance": max(0.0, float(r.mean()) / scale),
            "std": float(r.std()) / scale,
        }
        for dim, r in zip(varied, rises, strict=True)
    ]
    return {**base, "params": sorted(params, key=lambda p: -p["importance"])}


def _varies(name: str, trials: Sequence[TrialSummary]) -> bool:
    """Whether hyperparameter `name` takes two values among `trials` (stops at the second)."""
    values = (str(t.params.get(name)) for t in trials)
    first = next(values, None)
    return any(v != first for v in values)


def _permutation_rises(
    forest: Any, x: np.ndarray, y: np.ndarray, rng: np.random.Generator, repeats: int = 5
) -> np.ndarray:
    """Per column of `x`, the rise of the forest's mean squared error on (`x`, `y`) when that
    column alone is shuffled, once per repeat (shape columns x repeats): what scikit-learn's
    `permutation_importance` measures, with every shuffled copy predicted in one call (its 5 x
    columns calls of `predict` were half of a chart's first answer: 72 against 7 ms per forest)."""
    n, columns = x.shape
    copies = np.repeat(x[None, :, :], columns * repeats, axis=0)
    for c in range(columns):
        for r in range(repeats):
            copies[c * repeats + r, :, c] = x[rng.permutation(n), c]
    base = float(np.mean((forest.predict(x) - y) ** 2))
    predicted = forest.predict(copies.reshape(-1, x.shape[1])).reshape(columns, repeats, n)
    return np.asarray(np.mean((predicted - y) ** 2, axis=2) - base)


def holds_by_arm(dim: Dimension, *groups: Sequence[TrialSummary]) -> dict[str, bool]:
    """`dim.applies` by arm key, once per arm of the trials (per trial, it was a third of the axis
    chart's first call at 50,000 trials)."""
    out: dict[str, bool] = {}
    for trials in groups:
        for t in trials:
            if t.arm_key not in out:
                out[t.arm_key] = dim.applies(t.arm)
    return out
