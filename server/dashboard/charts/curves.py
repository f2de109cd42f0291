"""Training curves: the best trials' curves of a study, and every curve of one trial, downsampled
for the browser."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from sqlalchemy import text
from sqlalchemy.orm import Session

from hpo.server.analysis import load
from hpo.server.analysis.aliases import CHECKED_METRICS, aliases_of, metric_name, missing_metric, setting
from hpo.server.analysis.model import arm_label
from hpo.server.analysis.service import horizon_of, json_safe
from hpo.server.dashboard.charts.common import hover, objective_sign, robust_range, trial_summaries
from hpo.server.dashboard.charts.encoding import plain_text
from hpo.server.db import Database
from hpo.server.errors import NotFound
from hpo.server.metrics import sketches
from hpo.server.models import Trial
from hpo.server.spec.model import ANALYSIS_METRICS

CURVE_POINTS = sketches.POINTS

MAX_CURVES = 5000

# Curves drawn by default: every trial of most studies; past that the best ones (a thousand
# overlapping curves is a texture, not a plot; the person can ask for up to MAX_CURVES).
CURVES_SHOWN = 300


def curves_chart(session: Session, study: load.StudyInfo, options: dict[str, Any]) -> dict[str, Any]:
    """Curves of `metric` (default: the objective) for the best `limit` original trials
    (`CURVES_SHOWN` by default) and the replicas of those (rank None, `replica_of` set), optionally
    of one `arm` (its label), downsampled to about `points` points. hpo's `train/loss` reads the
    script's own name where `analysis.aliases` maps one onto it (`reported_as`); `missing` says in
    words when trials reported but none of them `metric`."""
    metric = str(options.get("metric") or study.metric)
    aliases = aliases_of(study.spec)
    own = metric_name(aliases, metric)
    limit = int(options.get("limit") or CURVES_SHOWN)
    points = int(options.get("points") or CURVE_POINTS)
    sign = objective_sign(study)
    trials = [t for t in trial_summaries(session, study.id) if t.status != "pending"]
    arm = options.get("arm")
    if arm:
        trials = [t for t in trials if arm_label(t.arm) == arm]
    # One "best" (docs/analysis.md, "Which trials count"): originals ranked as the analysis ranks
    # them; a replica is never ranked, it is drawn beside the trial it repeats (marked `replica_of`).
    originals = [t for t in trials if t.replica_of is None]
    originals.sort(key=lambda t: (not t.feasible, sign * float(t.objective or 0.0) if t.feasible else 0.0, t.number))
    ranked = originals[:limit]
    shown = {t.id for t in ranked}
    replicas = [t for t in trials if t.replica_of in shown][: max(0, limit)]
    chosen = [*ranked, *replicas]
    ranks = {t.id: rank for rank, t in enumerate(ranked, start=1)}
    width = sketches.bucket_width(horizon_of(session, study), points)
    raw = sketches.curves(session, [t.id for t in chosen], own, width)
    curves: list[dict[str, Any]] = []
    for t in chosen:
        steps, values = raw.get(t.id, ([], []))
        if not steps:
            continue
        curves.append(
            {
                "id": t.id,
                "number": t.number,
                "rank": ranks.get(t.id),
                "replica_of": t.replica_of,
                "arm": arm_label(t.arm),
                "status": t.status,
                "text": hover(t, study.metric),
                "steps": steps,
                "values": values,
            }
        )
    log = is_loss(metric) and all(v is None or v > 0 for c in curves for v in c["values"])
    every = np.array([v for c in curves for v in c["values"] if v is not None], dtype=float)
    reported = any(t.objective is not None for t in chosen)  # they reported, but not this metric
    return {
        "metric_name": metric,
        "reported_as": own,
        "missing": missing_metric(aliases, metric) if reported and not curves else None,
        "curves": curves,
        "log_y": log,
        "y_range": robust_range(every, log) if len(every) else None,
        "n_trials": len(trials),
        "width": width,
        "arms": sorted({arm_label(t.arm) for t in trials}),
    }


def is_loss(metric: str) -> bool:
    """Losses are drawn on a log axis: their interesting part spans decades."""
    return "loss" in metric or "perplexity" in metric


def trial_curves(db: Database, trial_id: int, points: int = 400) -> dict[str, Any]:
    """Every metric of one trial, downsampled to about `points` points, for its page."""
    with db.transaction() as session:
        row = session.get(Trial, trial_id)
        if row is None:
            raise NotFound(f"trial {trial_id} not found")
        study = load.study_info(session, row.study_id)
        names = [
            r[0]
            for r in session.execute(
                text("SELECT DISTINCT name FROM metric_points WHERE trial_id = :id ORDER BY name"), {"id": trial_id}
            )
        ]
        last = session.execute(text("SELECT max(step) FROM metric_points WHERE trial_id = :id"), {"id": trial_id})
        horizon = horizon_of(session, study) or float(last.scalar() or 1)
        width = sketches.bucket_width(horizon, points)
        aliases = aliases_of(study.spec)
        hpo_name = {metric_name(aliases, n): n for n in ANALYSIS_METRICS if metric_name(aliases, n) != n}
        metrics = []
        for name in names:
            steps, values = sketches.downsampled(session, [trial_id], name, width).get(trial_id, ([], []))
            alias = hpo_name.get(name)  # the script's own name for one of hpo's (analysis.aliases)
            log = is_loss(alias or name) and all(v is None or v > 0 for v in values)
            # one trial's own curve: every point in view (robust limits are for many curves)
            metrics.append(
                {"name": name, "alias": alias, "steps": steps, "values": values, "log_y": log, "y_range": None}
            )
        metrics.sort(key=lambda m: (m["name"] != study.metric, not is_loss(m["alias"] or m["name"]), m["name"]))
        clip = setting(aliases, "grad_clip_norm", row.params or {}, study.spec)
        # The names the analysis reads that this trial never reported, in words (once it reported any).
        missing = [missing_metric(aliases, n) for n in CHECKED_METRICS if metric_name(aliases, n) not in names]
        missing = missing if names else []
        return plain_text(
            json_safe(
                {
                    "trial_id": trial_id,
                    "status": row.status.value,
                    "objective": study.metric,
                    "best_step": row.best_step,
                    "grad_clip_norm": clip if _positive(clip) else None,
                    "grad_norm_metric": metric_name(aliases, "train/grad_norm"),
                    "metrics": metrics,
                    "missing": missing,
                }
            )
        )


def _positive(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0
