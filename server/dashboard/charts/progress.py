"""Progress charts: trials finished by status with an estimated time to finish, and the objective's
history over the trials in the order they finished (the best so far)."""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from hpo.server.analysis import load
from hpo.server.analysis.model import TrialSummary, arm_label
from hpo.server.dashboard.charts.common import hovers, objective_sign, original_trials, trial_summaries, worst_value
from hpo.server.models import Trial, TrialStatus

# Points per history chart or axis panel past which the dense middle is thinned: the best
# THIN_BEST always, the rest an even sample in trial order, so 50,000 trials send what a few
# thousand draw the same (the best so far is still computed over every trial).
THIN_POINTS = 2000

THIN_BEST = 1000

STALL_SECONDS = 300.0  # nothing started or finished for this long while trials wait: say so

_FINISHED = ("completed", "infeasible", "failed", "cancelled")

_FINISHED_STATUSES = tuple(TrialStatus(s) for s in _FINISHED)


def progress_chart(session: Session, study: load.StudyInfo, _options: dict[str, Any]) -> dict[str, Any]:
    """Counts, ETA from the finishing rate of the last hour's trials, running trials and a stall
    signal; cheap, so pages poll it every few seconds: the counts and the newest start and finish
    are aggregated in the database, and only the finish times and the running trials leave it (a
    row per trial through the ORM took 1.5 s at 50,000 trials)."""
    mine = Trial.study_id == study.id
    counts = dict.fromkeys(("pending", "running", "completed", "infeasible", "failed", "cancelled"), 0)
    for status, n in session.execute(select(Trial.status, func.count()).where(mine).group_by(Trial.status)):
        counts[status.value] = int(n)
    newest = session.execute(select(func.max(Trial.started_at), func.max(Trial.finished_at)).where(mine)).one()
    events = [_ts(at) for at in newest if at is not None]
    last_event = max(events) if events else None
    finished_at = [
        _ts(at)
        for at in session.scalars(
            select(Trial.finished_at).where(mine, Trial.status.in_(_FINISHED_STATUSES), Trial.finished_at.is_not(None))
        )
        if at is not None
    ]
    columns = (Trial.id, Trial.number, Trial.started_at, Trial.worker_id)
    running = [
        {"id": r.id, "number": r.number, "started_at": _ts(r.started_at) if r.started_at is not None else None,
         "worker_id": r.worker_id}
        for r in session.execute(select(*columns).where(mine, Trial.status == TrialStatus.running))
    ]  # fmt: skip
    now = datetime.now(timezone.utc).timestamp()
    total = sum(counts.values())
    finished = sum(counts[s] for s in _FINISHED)
    remaining = counts["pending"] + counts["running"]
    idle = None if last_event is None else max(0.0, now - last_event)
    # one status everywhere: the effective status `GET /studies/{id}` answers (all trials finished
    # reads `completed`; a bayesian study between proposals keeps its stored status)
    done = study.status == "active" and total > 0 and not remaining and study.spec.get("algorithm") != "bayesian"
    return {
        "status": "completed" if done else study.status,
        "counts": counts,
        "total": total,
        "finished": finished,
        "running": sorted(running, key=lambda r: r["id"]),
        "rate_per_hour": _rate(finished_at, now),
        "eta_seconds": eta_seconds(finished_at, remaining, now),
        "idle_seconds": idle,
        "stalled": bool(remaining and study.status == "active" and (idle is None or idle > STALL_SECONDS)),
        "version": f"{finished}:{counts['running']}:{last_event or 0}",
    }


def _ts(at: datetime) -> float:
    return (at if at.tzinfo else at.replace(tzinfo=timezone.utc)).timestamp()


def _rate(finished_at: Sequence[float], now: float, window: float = 3600.0) -> float | None:
    recent = sorted(t for t in finished_at if now - t <= window)
    if len(recent) < 2:
        return None
    span = max(now - recent[0], 1.0)
    return len(recent) / span * 3600.0


def eta_seconds(finished_at: Sequence[float], remaining: int, now: float, window: float = 3600.0) -> float | None:
    """Seconds until the remaining trials finish at the rate the last hour's trials finished;
    None without two recent finishes (no rate to go on) or with nothing left."""
    rate = _rate(finished_at, now, window)
    if not remaining or rate is None or rate <= 0:
        return None if remaining else 0.0
    return remaining / rate * 3600.0


def thin(trials: Sequence[TrialSummary], sign: float, budget: int = THIN_POINTS) -> list[TrialSummary]:
    """At most about `budget` of `trials`: all of them when fewer, else the THIN_BEST best (at most
    half the budget; in the study's mode; infeasible ones have no rank) and an even sample of the
    rest, in trial order."""
    if len(trials) <= budget:
        return list(trials)
    # nsmallest is sorted(...)[:k] without sorting every trial (five panels of 50,000)
    best = heapq.nsmallest(
        min(THIN_BEST, budget // 2), trials, key=lambda t: (t.objective is None, sign * float(t.objective or 0.0), t.id)
    )
    kept = {t.id for t in best}
    rest = [t for t in trials if t.id not in kept]
    step = len(rest) / max(1, budget - len(best))
    sample = [rest[int(i * step)] for i in range(min(len(rest), budget - len(best)))]
    return sorted([*best, *sample], key=lambda t: t.number)


def history_chart(session: Session, study: load.StudyInfo, _options: dict[str, Any]) -> dict[str, Any]:
    """The objective of each original trial against its number, by arm, infeasible trials as red
    crosses beyond the worst value, the best so far (originals only, as the analysis decides), and
    the completed replicas at the number of the trial they repeat (`replicas`, drawn hollow)."""
    trials = original_trials(session, study.id)
    numbers = {t.id: t.number for t in trials}
    sign = objective_sign(study)
    feasible = [t for t in trials if t.feasible]
    worst = worst_value([float(t.objective or 0.0) for t in feasible], study.mode)
    series: dict[str, dict[str, Any]] = {}
    shown = thin(feasible, sign)
    for t in shown:
        s = series.setdefault(t.arm_key, {"name": arm_label(t.arm), "x": [], "y": [], "ids": []})
        s["x"].append(t.number)
        s["y"].append(t.objective)
        s["ids"].append(t.id)
    bad_all = [t for t in trials if t.infeasible]
    bad = thin(bad_all, sign, THIN_POINTS // 4)
    copies = [t for t in trial_summaries(session, study.id) if t.replica_of is not None and t.feasible]
    best_x, best_y, best = [], [], None
    for t in sorted(feasible, key=lambda t: t.number):  # only where the best changes (drawn as steps)
        if best is None or sign * float(t.objective or 0.0) < sign * best:
            best = float(t.objective or 0.0)
            best_x.append(t.number)
            best_y.append(best)
    if best_x and trials and trials[-1].number > best_x[-1]:
        best_x.append(trials[-1].number)
        best_y.append(best_y[-1])
    return {
        "series": list(series.values()),
        "infeasible": {
            "x": [t.number for t in bad],
            "y": [worst] * len(bad),
            "ids": [t.id for t in bad],
        },
        "best": {"x": best_x, "y": best_y},
        # replicas at the number of the trial they repeat, drawn hollow, never the best so far
        "replicas": {
            "x": [numbers.get(t.replica_of or 0, t.number) for t in copies],
            "y": [t.objective for t in copies],
            "ids": [t.id for t in copies],
        },
        "text": {**hovers([*shown, *bad], study.metric), **hovers(copies, study.metric)},
        "n_feasible": len(feasible),
        "n_trials": len(trials),
        # how many points are drawn of how many (thinned past THIN_POINTS)
        "shown": len(shown) + len(bad),
        "n_points": len(feasible) + len(bad_all),
    }
