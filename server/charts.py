"""The data of the dashboard's interactive charts: one function per chart, each answering exactly
what the browser draws (plain JSON-ready dicts), loaded in one transaction with small queries.

Hover text names the trial (`trial <id>`, the id that every URL uses) with its params and value;
`ids` lists the trial id of every point so a click opens `/trials/<id>`. Curves are downsampled in
the database (one averaged point per step bucket), so 1,000 trials' curves stay a few tens of
thousands of points; y limits are robust (Tukey fences, in log space for losses) so one divergent
trial cannot flatten the rest (playbook, "Examining the training curves")."""

from __future__ import annotations

import heapq
import json
import logging
import math
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timezone
from typing import Any, Literal, get_args

import numpy as np
from sqlalchemy import func, select, text
from sqlalchemy.orm import Session

from hpo.server.analysis import load
from hpo.server.analysis.aliases import CHECKED_METRICS, aliases_of, metric_name, missing_metric, setting
from hpo.server.analysis.model import TrialSummary, arm_label, fmt
from hpo.server.analysis.plotdata import plot_data
from hpo.server.analysis.rules.arms import arm_summaries
from hpo.server.analysis.rules.divergence import load_trials
from hpo.server.analysis.service import horizon_of, json_safe, kept_analysis
from hpo.server.cache import kept as kept_charts
from hpo.server.cache import memo
from hpo.server.db import Database, epoch_seconds
from hpo.server.errors import InvalidInput, NotFound
from hpo.server.metrics import sketches
from hpo.server.models import Trial, TrialAttempt, TrialStatus
from hpo.server.space.search_space import Dimension, dimensions
from hpo.server.spec.model import ANALYSIS_METRICS

_log = logging.getLogger("hpo.server.charts")

ChartKind = Literal[
    "progress",
    "history",
    "axis",
    "parallel",
    "contour",
    "importance",
    "curves",
    "grad_norm",
    "isolation",
    "best_steps",
    "budget",
    "timeline",
]
CHART_KINDS: tuple[str, ...] = get_args(ChartKind)
CURVE_POINTS = sketches.POINTS
MAX_CURVES = 5000
# Curves drawn by default: every trial of most studies; past that the best ones (a thousand
# overlapping curves is a texture, not a plot; the person can ask for up to MAX_CURVES).
CURVES_SHOWN = 300
PARALLEL_LINES = 1000
# Points per history chart or axis panel past which the dense middle is thinned: the best
# THIN_BEST always, the rest an even sample in trial order, so 50,000 trials send what a few
# thousand draw the same (the best so far is still computed over every trial).
THIN_POINTS = 2000
THIN_BEST = 1000
# An axis chart draws one panel per varied hyperparameter (five in a two-arm study): 2,000 points
# each took 930 ms of a 5,000-trial study's 2.5 s first visit to draw; 1,000 show the same shape.
AXIS_POINTS = 1000
# The contour's markers (its surface is interpolated over every trial).
CONTOUR_POINTS = THIN_POINTS
# The chart endpoint's options when the request names none (the study page's first requests).
PAGE_OPTIONS: dict[str, Any] = {
    "metric": None, "limit": CURVES_SHOWN, "points": CURVE_POINTS, "arm": None, "x": None, "y": None
}  # fmt: skip
STALL_SECONDS = 300.0  # nothing started or finished for this long while trials wait: say so
_FINISHED = ("completed", "infeasible", "failed", "cancelled")
_FINISHED_STATUSES = tuple(TrialStatus(s) for s in _FINISHED)


def chart(db: Database, study_id: int, kind: str, options: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The data of chart `kind` of a study. Raises `NotFound` for an unknown study or kind and
    `InvalidInput` for options that name nothing in the study."""
    return json.loads(chart_json(db, study_id, kind, options))


def chart_json(db: Database, study_id: int, kind: str, options: Mapping[str, Any] | None = None) -> bytes:
    """`chart(...)` as JSON bytes, kept while the study has not changed (`analysis.memo`)."""
    if kind not in _CHARTS:
        raise NotFound(f"no chart {kind!r}; charts: {', '.join(CHART_KINDS)}")
    opts = dict(options or {})
    if kind == "progress":  # the cheap poll: always fresh
        return dumps(_load(db, study_id, kind, opts))
    key = (kind, tuple(sorted((k, str(v)) for k, v in opts.items())))
    if kept_charts.keepable(kind, opts):  # a first-screen chart: kept in the database too

        def kept() -> bytes:
            return kept_charts.read_or_compute(db, study_id, kind, lambda: _computed(db, study_id, kind, opts))

        return memo.remember(db, study_id, key, kept)
    return memo.remember(db, study_id, key, lambda: _computed(db, study_id, kind, opts))


def page_chart(db: Database, study_id: int, kind: str) -> bytes:
    """`chart_json` with the options the study page asks with (the endpoint's defaults)."""
    return chart_json(db, study_id, kind, PAGE_OPTIONS)


def first_visit_answer(db: Database, study_id: int, kind: str) -> Any:
    """What a first visit reads for one of `kept_charts.KEPT`, through the endpoint's own path
    (which keeps it): the page's chart, or the analysis (the keeper's chore calls this)."""
    if kind == kept_charts.ANALYSIS:
        return kept_analysis(db, study_id)
    return page_chart(db, study_id, kind)


def _computed(db: Database, study_id: int, kind: str, options: dict[str, Any]) -> bytes:
    """One chart of a study computed at a time: the page asks for its first four at once, and
    computed side by side (Python threads share one core) they all answered when the slowest did;
    one after another, in the order asked, the first can be drawn while the next is computed."""
    with memo.one_at_a_time(db, study_id, "charts"):
        return dumps(_load(db, study_id, kind, options))


def _load(db: Database, study_id: int, kind: str, options: dict[str, Any]) -> dict[str, Any]:
    if kind in _FROM_PLOTDATA:
        return _FROM_PLOTDATA[kind](db, study_id, options)
    with db.transaction() as session:
        study = load.study_info(session, study_id)
        base = {"kind": kind, "study": study.name, "metric": study.metric, "mode": study.mode}
        return {**base, **_CHARTS[kind](session, study, options)}


def dumps(value: Any) -> bytes:
    """Compact JSON; non-finite floats become null (the slow walk only when there is one). Markup
    in any text is neutralised (`plain_json`)."""
    try:
        body = json.dumps(value, allow_nan=False, separators=(",", ":"), default=_plain).encode()
    except ValueError:
        body = json.dumps(json_safe(value), separators=(",", ":"), default=_plain).encode()
    return plain_json(body)


# Plotly draws `<a href=...>` in any text it is given (hover, legend, tick labels, titles) as a
# link, and `<span style=...>` as styled text. Chart text comes from specs and from trial code (a
# metric's name is any text a trial posts), so in every chart answer a `<` that opens a tag, but
# the hover's own `<br>`, becomes U+2039 `‹`, which Plotly shows as text (docs/security.md, "The
# dashboard"). In JSON a `<` occurs only inside strings, so one scan of the bytes finds them all.
_MARKUP = re.compile(rb"<(?=/?[A-Za-z])(?!br>)")
_MARKUP_TEXT = re.compile(r"<(?=/?[A-Za-z])(?!br>)")
LOOKALIKE = "\u2039"


def plain_json(body: bytes) -> bytes:
    """JSON bytes with every tag-opening `<` in its strings but `<br>` written as `‹` (an escape)."""
    return _MARKUP.sub(rb"\\u2039", body) if b"<" in body else body


def plain_text(value: Any) -> Any:
    """`value` (text, or lists and dicts holding text) as Plotly must draw it: never a link or styled
    markup (`plain_json` for an answer not yet in JSON)."""
    if isinstance(value, str):
        return _MARKUP_TEXT.sub(LOOKALIKE, value) if "<" in value else value
    if isinstance(value, dict):
        return {plain_text(k): plain_text(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain_text(v) for v in value]
    return value


def _plain(value: Any) -> Any:
    if hasattr(value, "item"):
        return value.item()
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, (set, frozenset)):
        return sorted(value, key=str)
    raise TypeError(f"not JSON: {type(value).__name__}")


def trial_summaries(session: Session, study_id: int) -> list[TrialSummary]:
    """The analysis' own trial summaries (`divergence.load_trials`): the same trials judged
    diverged (drawn as infeasible) and the same best trials as the analysis and the PNG plots,
    shared by the charts of one study version (kept in `memo`)."""
    trials, _ = load_trials(session, load.study_info(session, study_id))
    return trials


def warm(db: Database, study_id: int) -> None:
    """Computes the trial summaries every chart of the study starts from, unless kept: the study
    page calls it once it has answered, so the judgement is under way before the page asks for its
    charts (on a fresh server it was the first 0.3-1.4 s of every chart of a 5,000-trial study's
    first visit). Never raises: a chart asked for later computes, or reports, as before."""
    try:
        if kept_charts.all_kept(db, study_id):
            return  # the first screen reads kept answers: judging now would only compete with them
        with db.transaction() as session:
            trial_summaries(session, study_id)
    except Exception as exc:  # noqa: BLE001 -- a warm-up; the charts' own requests report errors
        _log.debug("warming study %s: %s", study_id, exc)


# --- helpers ----------------------------------------------------------------------------------


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


def _originals(session: Session, study_id: int) -> list[TrialSummary]:
    return [t for t in trial_summaries(session, study_id) if t.replica_of is None]


def _sign(study: load.StudyInfo) -> float:
    return 1.0 if study.mode == "min" else -1.0


def _worst(values: Sequence[float], mode: str) -> float:
    """Where infeasible trials are drawn: just beyond the worst feasible value."""
    if not values:
        return 1.0
    span = (max(values) - min(values)) or abs(max(values)) or 1.0
    return max(values) + 0.08 * span if mode == "min" else min(values) - 0.08 * span


def _axis_type(dim: Dimension) -> str:
    if dim.type == "categorical":
        return "category"
    return "log" if dim.scale == "log" else "linear"


def _bounds(dim: Dimension) -> list[Any] | None:
    if dim.type == "discrete" and dim.values:
        return [min(dim.values), max(dim.values)]
    if dim.min is not None and dim.max is not None:
        return [dim.min, dim.max]
    return None


def _numeric_dims(study: load.StudyInfo) -> list[Dimension]:
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


# --- progress ---------------------------------------------------------------------------------


def _progress(session: Session, study: load.StudyInfo, _options: dict[str, Any]) -> dict[str, Any]:
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


# --- history ----------------------------------------------------------------------------------


def _history(session: Session, study: load.StudyInfo, _options: dict[str, Any]) -> dict[str, Any]:
    """The objective of each original trial against its number, by arm, infeasible trials as red
    crosses beyond the worst value, the best so far (originals only, as the analysis decides), and
    the completed replicas at the number of the trial they repeat (`replicas`, drawn hollow)."""
    trials = _originals(session, study.id)
    numbers = {t.id: t.number for t in trials}
    sign = _sign(study)
    feasible = [t for t in trials if t.feasible]
    worst = _worst([float(t.objective or 0.0) for t in feasible], study.mode)
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


# --- axis -------------------------------------------------------------------------------------


def _axis(session: Session, study: load.StudyInfo, _options: dict[str, Any]) -> dict[str, Any]:
    """One panel per varied hyperparameter (a conditional one per arm, labelled with it): the
    objective of each original trial by arm, infeasible trials as red crosses beyond the worst
    value, completed replicas marked (`replicas`, drawn hollow, as in the history chart), the
    searched bounds, log axes for log scales."""
    trials = _originals(session, study.id)
    copies = [t for t in trial_summaries(session, study.id) if t.replica_of is not None and t.feasible]
    sign = _sign(study)
    drawn: set[int] = set()
    panels = []
    for dim in dimensions(study.spec):
        if not dim.varied:
            continue
        holds = _holds_by_arm(dim, trials, copies)
        mine = [t for t in trials if dim.name in t.params and holds[t.arm_key]]
        twins = [t for t in copies if dim.name in t.params and holds[t.arm_key]]
        feasible = [t for t in mine if t.feasible]
        worst = _worst([float(t.objective or 0.0) for t in feasible], study.mode)
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
                "axis_type": _axis_type(dim),
                "scale": dim.scale,
                "bounds": _bounds(dim),
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


def _holds_by_arm(dim: Dimension, *groups: Sequence[TrialSummary]) -> dict[str, bool]:
    """`dim.applies` by arm key, once per arm of the trials (per trial, it was a third of the axis
    chart's first call at 50,000 trials)."""
    out: dict[str, bool] = {}
    for trials in groups:
        for t in trials:
            if t.arm_key not in out:
                out[t.arm_key] = dim.applies(t.arm)
    return out


# --- parallel coordinates ---------------------------------------------------------------------


def _parallel(session: Session, study: load.StudyInfo, _options: dict[str, Any]) -> dict[str, Any]:
    """Feasible original trials as lines through one axis per varied hyperparameter and the
    objective; log scales as log10 with readable ticks, categories as indices with their names. A
    conditional hyperparameter is its own axis labelled with its arm; a trial of another arm
    crosses it at an `n/a` tick below its range. Each axis names its table column (`param`) and
    whether it is log10 (`log`), so brushing it can filter the trial table."""
    feasible = [t for t in _originals(session, study.id) if t.feasible]
    # Each line costs the browser's WebGL; past PARALLEL_LINES, the best ones (where the questions are)
    trials = sorted(feasible, key=lambda t: _sign(study) * float(t.objective or 0.0))[:PARALLEL_LINES]
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
            axis = {"label": dim.label, "param": dim.label, "values": values, "range": _bounds(dim)}
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


# --- timeline -------------------------------------------------------------------------------

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


def _timeline(session: Session, study: load.StudyInfo, _options: dict[str, Any]) -> dict[str, Any]:
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


# --- contour ----------------------------------------------------------------------------------


def _contour(session: Session, study: load.StudyInfo, options: dict[str, Any]) -> dict[str, Any]:
    """The objective over a pair of numeric hyperparameters (`x`, `y` options, each a label or an
    unambiguous name; the first valid pair by default), optionally within one `arm`, interpolated
    linearly between the trials on a 40 x 40 grid, with the trials on top. Conditional
    hyperparameters are their own dimensions: a pair never defined in the same trials (Adam's and
    Nesterov's learning rates) is refused, never pooled on one axis. `pairs` lists, for each
    choice, the choices it can be drawn against."""
    arm = options.get("arm") or None
    trials = [t for t in _originals(session, study.id) if t.feasible]
    labels = sorted({arm_label(t.arm) for t in _originals(session, study.id)})
    if arm is not None:
        if arm not in labels:
            raise InvalidInput.one("arm", f"{arm!r} is not an arm of this study; arms: {labels}")
        trials = [t for t in trials if arm_label(t.arm) == arm]
    arms = [a for a in queries_arms(study) if arm is None or arm_label(a) == arm]
    dims = {d.label: d for d in _numeric_dims(study) if any(d.applies(a) for a in arms)}
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
    hx, hy = _holds_by_arm(dx, trials), _holds_by_arm(dy, trials)
    trials = [t for t in trials if hx[t.arm_key] and hy[t.arm_key] and dx.name in t.params and dy.name in t.params]
    xs = np.array([float(t.params[dx.name]) for t in trials])
    ys = np.array([float(t.params[dy.name]) for t in trials])
    zs = np.array([float(t.objective or 0.0) for t in trials])
    grid = _grid(xs, ys, zs, dx.scale == "log", dy.scale == "log") if len(trials) >= 4 else None
    # The surface is interpolated over every trial; the markers on top are thinned like the history
    # chart's (23,000 markers of a 50,000-trial study were 4 MB and a 2.2 s WebGL draw).
    shown = thin(trials, _sign(study), CONTOUR_POINTS)
    points = {
        "x": [float(t.params[dx.name]) for t in shown],
        "y": [float(t.params[dy.name]) for t in shown],
        "ids": [t.id for t in shown],
    }
    return {
        **base,
        "x_type": _axis_type(dx),
        "y_type": _axis_type(dy),
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
    from scipy.interpolate import griddata

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


# --- importance -------------------------------------------------------------------------------

_IMPORTANCE_CACHE: dict[tuple[int, str], dict[str, Any]] = {}
_IMPORTANCE_LOCK = threading.Lock()
IMPORTANCE_METHOD = (
    "permutation importance of a random forest (scikit-learn RandomForestRegressor, 32 trees): how much the "
    "forest's R² drops when one hyperparameter's values are shuffled; a conditional hyperparameter is "
    "shuffled within the trials where it applies, its drop measured against the whole study's variance"
)


def _importance(session: Session, study: load.StudyInfo, options: dict[str, Any]) -> dict[str, Any]:
    """Which hyperparameters the objective depends on, over the completed original trials (of one
    `arm` when asked), conditional ones included as their own dimensions (`importance_by_dim`);
    cached per study and arm until a trial finishes (the forests cost a few hundred milliseconds on
    thousands of trials)."""
    arm = options.get("arm") or None
    trials = [t for t in _originals(session, study.id) if t.feasible]
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
    """Importance of every declaration, conditional ones included (DESIGN.md: conditional
    hyperparameters are separate dimensions, labelled with their arm): the unconditional ones over
    all `trials`, each group of declarations sharing a `when` over the trials where it applies
    (with the unconditional ones beside it, so it competes with them there). `learning_rate` under
    Adam and under Nesterov are two entries, `learning_rate (optimizer=adam)` and
    `learning_rate (optimizer=nesterov)`, each with the number of trials it was computed on."""
    plain = [d for d in dims if not d.when or all(_holds_by_arm(d, trials).values())]
    groups: dict[str, list[Dimension]] = {}
    for d in dims:
        if d not in plain:
            groups.setdefault(json.dumps(d.when, sort_keys=True, default=str), []).append(d)
    answer = importance(plain, trials)
    params = [{**p, "n": len(trials)} for p in answer["params"]]
    variance = float(np.var([float(t.objective or 0.0) for t in trials])) if trials else None
    for group in groups.values():
        holds = _holds_by_arm(group[0], trials)
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
    from sklearn.ensemble import RandomForestRegressor

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


# --- curves -----------------------------------------------------------------------------------


def _curves(session: Session, study: load.StudyInfo, options: dict[str, Any]) -> dict[str, Any]:
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
    sign = _sign(study)
    trials = [t for t in trial_summaries(session, study.id) if t.status != "pending"]
    arm = options.get("arm")
    if arm:
        trials = [t for t in trials if arm_label(t.arm) == arm]
    # One "best" (DESIGN.md): originals ranked as the analysis ranks them; a replica is never
    # ranked, it is drawn beside the trial it repeats (marked `replica_of`).
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


# --- charts drawn from the report plots' data ---------------------------------------------------


def _grad_norm(db: Database, study_id: int, _options: dict[str, Any]) -> dict[str, Any]:
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


def _isolation(db: Database, study_id: int, _options: dict[str, Any]) -> dict[str, Any]:
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


def _best_steps(db: Database, study_id: int, _options: dict[str, Any]) -> dict[str, Any]:
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


def _budget(db: Database, study_id: int, _options: dict[str, Any]) -> dict[str, Any]:
    data = plot_data(db, study_id, "budget")
    keys = ("label", "n", "k", "p5", "p25", "median", "p75", "p95", "mean", "flattened")
    series = [{k: s.get(k) for k in keys} for s in data["series"]]
    return {"kind": "budget", "study": data["study"], "metric": data["metric"], "mode": data["mode"], "series": series}


_CHARTS: dict[str, Callable[[Session, load.StudyInfo, dict[str, Any]], dict[str, Any]]] = {
    "progress": _progress,
    "history": _history,
    "axis": _axis,
    "parallel": _parallel,
    "contour": _contour,
    "importance": _importance,
    "curves": _curves,
    "grad_norm": lambda *_: {},
    "isolation": lambda *_: {},
    "best_steps": lambda *_: {},
    "budget": lambda *_: {},
    "timeline": _timeline,
}
_FROM_PLOTDATA: dict[str, Callable[[Database, int, dict[str, Any]], dict[str, Any]]] = {
    "grad_norm": _grad_norm,
    "isolation": _isolation,
    "best_steps": _best_steps,
    "budget": _budget,
}


def best_per_arm(db: Database, study_id: int) -> dict[str, Any]:
    """For the compare page: a study's best trial per arm (arm summaries of the analysis)."""
    with db.transaction() as session:
        study = load.study_info(session, study_id)
        arms = arm_summaries(trial_summaries(session, study_id), _sign(study))
    return json_safe({"id": study.id, "name": study.name, "metric": study.metric, "mode": study.mode, "arms": arms})
