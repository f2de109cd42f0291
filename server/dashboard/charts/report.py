"""Charts drawn from the report plots' data (dashboard.plotdata): gradient norms, isolation, best
steps, the tuning budget, and the best trial per arm."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from sqlalchemy import select

from hpo.server.analysis import load
from hpo.server.analysis.aliases import aliases_of, setting
from hpo.server.analysis.rules.arms import arm_summaries
from hpo.server.analysis.service import json_safe
from hpo.server.dashboard.charts.common import (
    objective_sign,
    trial_summaries,
)
from hpo.server.dashboard.charts.curves import _positive
from hpo.server.dashboard.plotdata import plot_data
from hpo.server.db import Database
from hpo.server.models import Trial


def grad_norm_chart(db: Database, study_id: int, _options: dict[str, Any]) -> dict[str, Any]:
    """The unclipped gradient norm of each arm's best trial, with its 90th percentile and the
    trial's clipping threshold when it clips (params.grad_clip_norm)."""
    data = plot_data(db, study_id, "grad_norm")
    with db.transaction() as session:
        ids = [int(e["trial_id"]) for e in data["entries"]]
        rows = session.execute(select(Trial.id, Trial.params).where(Trial.id.in_(ids))).all() if ids else []
        clips: dict[int, Any] = {r.id: r.params for r in rows}
        spec = load.study_info(session, study_id).spec
    aliases = aliases_of(spec)
    entries = []
    for e in data["entries"]:
        curve = e.get("curve")
        steps, values = _thin(curve.steps, curve.values) if curve is not None and len(curve) else ([], [])
        clip = setting(aliases, "grad_clip_norm", clips.get(e["trial_id"]) or {}, spec)
        clip = clip if _positive(clip) else None
        entries.append(
            {
                "id": e["trial_id"],
                "label": e["label"],
                "p90": e.get("p90"),
                "clip": clip,
                "steps": steps,
                "values": values,
            }
        )
    return {
        "kind": "grad_norm",
        "study": data["study"],
        "metric": data["metric"],
        "reported_as": data["grad_metric"],
        "missing": data["missing"],
        "entries": entries,
    }


def _thin(steps: np.ndarray, values: np.ndarray, points: int = 400) -> tuple[list[float], list[float | None]]:
    """Every k-th point of a long curve (k so that about `points` remain); NaN becomes None."""
    k = max(1, math.ceil(len(steps) / points))
    return steps[::k].tolist(), [None if not math.isfinite(v) else float(v) for v in values[::k]]


def isolation_chart(db: Database, study_id: int, _options: dict[str, Any]) -> dict[str, Any]:
    """Best trial per scientific value with error bars (replica std) and, when the analysis
    computed one, the replica confidence interval of that arm."""
    data = plot_data(db, study_id, "isolation")
    arms = {a["best_trial_id"]: a for a in data["arms"] if a["best_trial_id"] is not None}
    series = []
    for s in data["series"]:
        points = [p for p in s["points"] if p["best_value"] is not None]
        series.append(
            {
                "param": s["param"],
                "kind": s["kind"],
                "ordered": bool(s.get("ordered")),  # arms along one ordered hyperparameter's values
                "label": s.get("label"),
                "x": [p["x"] for p in points],
                "y": [p["best_value"] for p in points],
                "std": [p.get("std") for p in points],
                "ci": [arms.get(p["trial_id"], {}).get("replica_ci") for p in points],
                "n": [p.get("n") for p in points],
                "ids": [p["trial_id"] for p in points],
            }
        )
    return {
        "kind": "isolation",
        "study": data["study"],
        "metric": data["metric"],
        "mode": data["mode"],
        "series": series,
    }


def best_steps_chart(db: Database, study_id: int, _options: dict[str, Any]) -> dict[str, Any]:
    data = plot_data(db, study_id, "best_steps")
    summary = data["summary"]
    top = summary.get("top") or {}
    return {
        "kind": "best_steps",
        "study": data["study"],
        "metric": data["metric"],
        "max_train_steps": summary.get("max_train_steps"),
        "fractions": summary.get("best_step_fractions") or [],
        "top_fractions": top.get("fractions") or [],
    }


def budget_chart(db: Database, study_id: int, _options: dict[str, Any]) -> dict[str, Any]:
    data = plot_data(db, study_id, "budget")
    keys = ("label", "n", "k", "p5", "p25", "median", "p75", "p95", "mean", "flattened")
    series = [{k: s.get(k) for k in keys} for s in data["series"]]
    return {"kind": "budget", "study": data["study"], "metric": data["metric"], "mode": data["mode"], "series": series}


def best_per_arm(db: Database, study_id: int) -> dict[str, Any]:
    """For the compare page: a study's best trial per arm (arm summaries of the analysis)."""
    with db.transaction() as session:
        study = load.study_info(session, study_id)
        arms = arm_summaries(trial_summaries(session, study_id), objective_sign(study))
    return json_safe({"id": study.id, "name": study.name, "metric": study.metric, "mode": study.mode, "arms": arms})
