"""The timeline: each trial's attempts as bars on the workers' clock, with stragglers and the time
the study's workers were busy."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

import numpy as np
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from hpo.server.analysis import load
from hpo.server.db import epoch_seconds
from hpo.server.models import Trial, TrialAttempt, TrialStatus

STRAGGLER_FACTOR = 3.0  # an attempt that ran this many times the median completed attempt

# How an attempt ended (`bars.outcome` indexes this list): a trial_attempts outcome, `running`, or
# for a trial from before attempts were recorded (migration 0011) its status, one bar for all.
OUTCOMES = (
    "completed",
    "running",
    "preempted",
    "expired",
    "error",
    "infeasible",
    "config",
    "cancelled",
    "failed",
    "pending",
    "unknown",
)

_OUTCOME_INDEX = {name: i for i, name in enumerate(OUTCOMES)}


def timeline_chart(session: Session, study: load.StudyInfo, _options: dict[str, Any]) -> dict[str, Any]:
    """Each attempt of each trial as a bar over wall-clock time on the row of the worker that ran
    it, from its claim to its end (now while it runs), with how it ended (`OUTCOMES`: completed,
    preempted, an expired lease, error, infeasible, config, cancelled, running): gaps in a row are
    an idle worker, a trial's bars on several rows its preemptions and retries, `stragglers` the
    bars (indexes) of completed or running attempts over STRAGGLER_FACTOR times the median
    completed attempt. A trial that started before attempts were recorded is one bar from its first
    start to its finish, its status as the outcome and `attempt` null. Columnar and bare (no hover
    text: the page builds it), so 50,000 trials stay small: `start` and `end` are seconds (0.1 s)
    after `t0`, the first start in milliseconds since the epoch; `workers` lists each row's
    attempts, trials and busy share of the study's span."""
    first = func.coalesce(TrialAttempt.started_at, Trial.started_at)
    rows = session.execute(
        select(
            Trial.id,
            Trial.status,
            epoch_seconds(Trial.started_at).label("started_at"),
            epoch_seconds(Trial.finished_at).label("finished_at"),
            Trial.worker_id,
            Trial.attempt.label("attempts"),
            Trial.replica_of,
            TrialAttempt.attempt,
            TrialAttempt.worker_id.label("attempt_worker"),
            epoch_seconds(TrialAttempt.started_at).label("attempt_start"),
            epoch_seconds(TrialAttempt.ended_at).label("ended_at"),
            TrialAttempt.outcome,
        )
        .outerjoin(TrialAttempt, TrialAttempt.trial_id == Trial.id)
        .where(Trial.study_id == study.id, Trial.started_at.is_not(None))
        .order_by(first, Trial.id, TrialAttempt.attempt)
    ).all()
    now = datetime.now(timezone.utc).timestamp()
    names: dict[str, int] = {}
    keys = ("ids", "attempt", "attempts", "worker", "start", "end", "outcome", "replica")
    bars: dict[str, list[Any]] = {k: [] for k in keys}
    spans: dict[int, list[tuple[float, float]]] = {}
    trials_on: dict[int, set[int]] = {}
    t0 = (rows[0].attempt_start if rows[0].attempt_start is not None else rows[0].started_at) if rows else 0.0
    for r in rows:
        start, end, outcome = _attempt_span(r, now)
        w = names.setdefault(r.attempt_worker or r.worker_id or "(unknown)", len(names))
        bars["ids"].append(r.id)
        bars["attempt"].append(r.attempt)
        bars["attempts"].append(r.attempts)
        bars["worker"].append(w)
        bars["start"].append(round(start - t0, 1))
        bars["end"].append(round(end - t0, 1))
        bars["outcome"].append(_OUTCOME_INDEX[outcome])
        bars["replica"].append(r.replica_of is not None)
        spans.setdefault(w, []).append((start, end))
        trials_on.setdefault(w, set()).add(r.id)
    median, stragglers = _stragglers(bars)
    span = max(bars["end"], default=0.0)
    # the busy share over the unrounded span: the rounded one can be a few hundredths short of it
    exact_span = max((end for intervals in spans.values() for _, end in intervals), default=t0) - t0
    workers = []
    for name, w in names.items():
        busy = _union_seconds(spans[w])
        share = min(1.0, busy / exact_span) if span > 0 and exact_span > 0 else None
        workers.append({"name": name, "attempts": len(spans[w]), "trials": len(trials_on[w]), "busy_fraction": share})
    return {
        "workers": workers,
        "outcomes": list(OUTCOMES),
        "bars": bars,
        "stragglers": stragglers,
        "median_seconds": median,
        "t0": round(t0 * 1000) if rows else None,
        "span_seconds": span,
        "now": round(now - t0, 1) if rows else None,
        "n": len(bars["ids"]),
        "n_trials": len({*bars["ids"]}),
    }


def _attempt_span(r: Any, now: float) -> tuple[float, float, str]:
    """(start, end, outcome) of one attempt row (times in seconds since the epoch), or of a trial
    without recorded attempts."""
    if r.attempt is None:  # started before migration 0011: one bar, first start to finish
        start = r.started_at
        end = now if r.finished_at is None else max(start, r.finished_at)
        return start, end, r.status.value
    start = r.attempt_start
    if r.ended_at is not None:
        return start, max(start, r.ended_at), r.outcome if r.outcome in _OUTCOME_INDEX else "unknown"
    if r.status is TrialStatus.running and r.attempts == r.attempt:
        return start, max(start, now), "running"
    # Open, yet not the trial's running attempt (never written so by hpo.server.trials.leases).
    return start, start if r.finished_at is None else max(start, r.finished_at), "unknown"


def _stragglers(bars: dict[str, list[Any]]) -> tuple[float | None, list[int]]:
    """The median completed attempt's seconds, and the bars (indexes) of completed or running
    attempts over STRAGGLER_FACTOR times it (at least 5 completed attempts)."""
    completed, running = _OUTCOME_INDEX["completed"], _OUTCOME_INDEX["running"]
    durations = [b - a for a, b, o in zip(bars["start"], bars["end"], bars["outcome"], strict=True) if o == completed]
    median = float(np.median(durations)) if durations else None
    if not median or len(durations) < 5:
        return median, []
    long = STRAGGLER_FACTOR * median
    pairs = zip(bars["start"], bars["end"], bars["outcome"], strict=True)
    return median, [i for i, (a, b, o) in enumerate(pairs) if o in (completed, running) and b - a > long]


def _union_seconds(intervals: Sequence[tuple[float, float]]) -> float:
    """Seconds covered by the union of `intervals` (a worker running two trials at once counts once)."""
    total, cur_lo, cur_hi = 0.0, None, None
    for a, b in sorted(intervals):
        if cur_hi is None or a > cur_hi:
            if cur_hi is not None and cur_lo is not None:
                total += cur_hi - cur_lo
            cur_lo, cur_hi = a, b
        else:
            cur_hi = max(cur_hi, b)
    if cur_hi is not None and cur_lo is not None:
        total += cur_hi - cur_lo
    return total
