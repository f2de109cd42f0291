"""The dashboard's trial table: every trial of a study, sorted, filtered (status, arm, parameter
ranges) and paged on the server, so a 5,000-trial study answers one page at a time.

One column per hyperparameter declaration (`columns`): a conditional hyperparameter is its own
column labelled with its arm (`learning_rate (optimizer=adam)`), empty in the trials where it does
not apply. `sort` is a fixed key, `param:NAME` (a column's label, or a name declared once) or
`metric:NAME` (each trial's best value of that metric; the objective's is the analysis' own).

Filtering happens over the trial summaries (params are JSON documents, so a range filter is not
portable SQL); a study's summaries are a few milliseconds per thousand trials."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import func, select, text

from hpo.server.analysis import load
from hpo.server.analysis.model import TrialSummary, arm_label
from hpo.server.analysis.service import json_safe
from hpo.server.dashboard.charts.common import trial_summaries
from hpo.server.db import Database
from hpo.server.errors import FieldError, InvalidInput
from hpo.server.models import MetricPoint, Trial, resumed
from hpo.server.space.search_space import Dimension, dimensions

SORT_KEYS = ("number", "id", "objective", "status", "best_step", "started_at", "finished_at", "duration")
SORT_PREFIXES = ("param:", "metric:")
# A metric other than the objective is best at its minimum unless its name says higher is better.
_HIGHER_IS_BETTER = ("acc", "auc", "f1", "precision", "recall", "bleu", "rouge", "map", "score", "reward", "iou")
REASON_CHARS = 300
_FILTER = re.compile(r"^(?P<name>[^=:(]+(?:\([^)]*\))?)(?P<rest>[:=].*)$", re.S)
STATUSES = ("pending", "running", "completed", "infeasible", "failed", "cancelled")


@dataclass(frozen=True)
class ParamRange:
    """`name:lo:hi`; an empty bound is open. A categorical filter is `name=value`."""

    name: str
    lo: float | None = None
    hi: float | None = None
    equals: str | None = None

    def admits(self, value: Any) -> bool:
        if value is None:
            return False
        if self.equals is not None:
            return str(value) == self.equals
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            return False
        return (self.lo is None or value >= self.lo) and (self.hi is None or value <= self.hi)


@dataclass(frozen=True)
class TableQuery:
    sort: str = "number"
    descending: bool = False
    statuses: tuple[str, ...] = ()
    arm: str | None = None
    params: tuple[ParamRange, ...] = field(default_factory=tuple)
    offset: int = 0
    limit: int = 50


def parse_param_filters(raw: Sequence[str]) -> tuple[ParamRange, ...]:
    """`["learning_rate:1e-4:1e-2", "optimizer=adam", "dropout::0.3"]` -> ranges; a 422 naming the
    `param` field and the reason for anything else."""
    out = []
    for i, given in enumerate(raw):
        # a conditional hyperparameter's label carries its arm: `learning_rate (optimizer=adam):LO:HI`
        match = _FILTER.match(given)
        if match is None:
            raise InvalidInput.one(f"param[{i}]", f"expected NAME:LO:HI or NAME=VALUE, got {given!r}")
        name, rest = match.group("name").strip(), match.group("rest")
        if rest.startswith("="):
            out.append(ParamRange(name, equals=rest[1:]))
            continue
        parts = [name, *rest[1:].split(":")]
        if len(parts) != 3 or not parts[0]:
            raise InvalidInput.one(f"param[{i}]", f"expected NAME:LO:HI or NAME=VALUE, got {given!r}")
        bounds: list[float | None] = []
        for part in parts[1:]:
            try:
                bounds.append(float(part) if part.strip() else None)
            except ValueError:
                raise InvalidInput.one(f"param[{i}]", f"bound {part!r} is not a number") from None
            if bounds[-1] is not None and not math.isfinite(bounds[-1] or 0.0):
                raise InvalidInput.one(f"param[{i}]", "bounds must be finite")
        out.append(ParamRange(parts[0], bounds[0], bounds[1]))
    return tuple(out)


@dataclass(frozen=True)
class Column:
    """One hyperparameter declaration shown as a table column (`label` names it, `name` is its key
    in the trials' params)."""

    dim: Dimension

    @property
    def label(self) -> str:
        return self.dim.label

    def value(self, t: TrialSummary) -> Any:
        """The trial's value, None where the declaration does not apply (another arm's)."""
        if not self.dim.applies(t.arm):
            return None
        value = t.params.get(self.dim.name)
        return t.arm.get(self.dim.name) if value is None else value

    def public(self) -> dict[str, Any]:
        d = self.dim
        return {
            "label": d.label,
            "name": d.name,
            "role": d.role,
            "type": d.type,
            "when": dict(d.when) if d.when else None,
            "scale": d.scale,
            "categories": [str(v) for v in d.values] if d.type == "categorical" else None,
        }


def columns(spec: Mapping[str, Any]) -> list[Column]:
    """Every declaration that is not fixed, in spec order (scientific ones first, as the page's
    search-space table lists them)."""
    dims = [d for d in dimensions(spec) if d.role != "fixed"]
    dims.sort(key=lambda d: d.role != "scientific")
    return [Column(d) for d in dims]


def resolve(cols: Sequence[Column], field_name: str, wanted: str) -> Column:
    """The column `wanted` names: a label, or a name declared once (a 422 naming `field_name`)."""
    for c in cols:
        if c.label == wanted:
            return c
    named = [c for c in cols if c.dim.name == wanted]
    if len(named) == 1:
        return named[0]
    labels = [c.label for c in cols]
    if named:
        raise InvalidInput.one(field_name, f"{wanted!r} is declared per arm; name one of {[c.label for c in named]}")
    raise InvalidInput.one(field_name, f"unknown hyperparameter {wanted!r}; one of {labels}")


def higher_is_better(metric: str) -> bool:
    last = metric.rsplit("/", 1)[-1].lower()
    return any(word in last for word in _HIGHER_IS_BETTER)


def trial_table(db: Database, study_id: int, query: TableQuery) -> dict[str, Any]:
    """`{total, filtered, offset, limit, columns: [...], rows: [...], params: [labels], arms}`;
    each row's `values` holds its value per column label (null where a column does not apply),
    `replica_of`, `retry_of` and, for a failed or infeasible trial, `reason`."""
    errors = [
        FieldError("status", f"unknown status {s!r}; one of {list(STATUSES)}")
        for s in query.statuses
        if s not in STATUSES
    ]
    if query.sort not in SORT_KEYS and not query.sort.startswith(SORT_PREFIXES):
        errors.append(
            FieldError("sort", f"unknown sort key {query.sort!r}; one of {list(SORT_KEYS)}, param:NAME or metric:NAME")
        )
    if errors:
        raise InvalidInput(errors)
    with db.transaction() as session:
        study = load.study_info(session, study_id)
        cols = columns(study.spec)
        filters = [(resolve(cols, f"param[{i}]", r.name), r) for i, r in enumerate(query.params)]
        sort_col = resolve(cols, "sort", query.sort[len("param:") :]) if query.sort.startswith("param:") else None
        trials = trial_summaries(session, study_id)
        extra = {
            r.id: (r.started_at, r.finished_at, r.retry_of, r.resumed_from_step)
            for r in session.execute(
                select(Trial.id, Trial.started_at, Trial.finished_at, Trial.retry_of, Trial.resumed_from_step).where(
                    Trial.study_id == study_id
                )
            )
        }
        metric, metric_values = None, None
        if query.sort.startswith("metric:"):
            metric = query.sort[len("metric:") :]
            metric_values = _metric_bests(session, study, metric, trials)
    times = {k: (v[0], v[1]) for k, v in extra.items()}
    arms = sorted({arm_label(t.arm) for t in trials})
    kept = [t for t in trials if _admits(t, query, filters)]
    sign = 1.0 if study.mode == "min" else -1.0
    if metric is not None and metric != study.metric:
        sign = -1.0 if higher_is_better(metric) else 1.0

    def key(t: TrialSummary) -> tuple[Any, ...]:
        if sort_col is not None:
            value = sort_col.value(t)
            numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
            return (value is None, float(value) if numeric else 0.0, "" if numeric else str(value), t.number)
        if metric_values is not None:
            best = metric_values.get(t.id)
            return (best is None, sign * best if best is not None else 0.0, t.number)
        return _sort_key(t, query.sort, sign, times)

    kept.sort(key=key, reverse=query.descending)
    if query.descending:  # reversed, but trials without the value stay last
        kept.sort(key=lambda t: key(t)[0])
    page = kept[query.offset : query.offset + query.limit]
    rows = []
    for t in page:
        row = _row(t, times.get(t.id, (None, None)), cols)
        row["retry_of"] = extra.get(t.id, (None, None, None, None))[2]
        row["resumed"] = resumed(t.best_step, extra.get(t.id, (None, None, None, None))[3])
        if metric_values is not None:
            row["metric_value"] = metric_values.get(t.id)
        rows.append(row)
    return json_safe(
        {
            "total": len(trials),
            "filtered": len(kept),
            "offset": query.offset,
            "limit": query.limit,
            "sort": query.sort,
            "metric": study.metric,
            "mode": study.mode,
            "sort_metric": None if metric is None else {"name": metric, "mode": "min" if sign > 0 else "max"},
            "columns": [c.public() for c in cols],
            "params": [c.label for c in cols],
            "arms": arms,
            "rows": rows,
        }
    )


def _metric_bests(session: Any, study: load.StudyInfo, metric: str, trials: Sequence[TrialSummary]) -> dict[int, float]:
    """Each trial's best finite value of `metric`: the analysis' objective for the study's own
    metric, else the minimum (the maximum for an accuracy-like name) of its points: an ended
    trial's kept minimum where the curve statistics hold one (`curve_stats.vmin`, the same
    aggregate), the points of the others. A metric no trial reported is a 422 naming `sort`."""
    if metric == study.metric:
        return {t.id: float(t.objective) for t in trials if t.objective is not None and math.isfinite(t.objective)}
    found: dict[int, float] = {}
    reported = False
    covered: set[int] = set()
    if not higher_is_better(metric):  # the kept maximum is +Infinity past a non-finite point
        for tid, vmin, n in session.execute(text(_KEPT_MINIMUM), {"study_id": study.id, "name": metric}):
            covered.add(tid)
            reported = reported or n > 0
            if vmin is not None:
                found[tid] = float(vmin)
    rest = [t.id for t in trials if t.id not in covered]
    agg = func.max(MetricPoint.value) if higher_is_better(metric) else func.min(MetricPoint.value)
    for start in range(0, len(rest), 1000):  # bounded IN lists
        for tid, v in session.execute(
            select(MetricPoint.trial_id, agg)
            .where(MetricPoint.name == metric, MetricPoint.trial_id.in_(rest[start : start + 1000]))
            .group_by(MetricPoint.trial_id)
        ):
            reported = True
            if v is not None:
                found[tid] = float(v)
    if not reported:
        raise InvalidInput.one("sort", f"no trial of this study reported the metric {metric!r}")
    return found


# The ended trials' kept statistics of one metric that still hold (their attempt's); `n` 0 where a
# trial reported none of it. 1,000,000 points' minimum took 300 ms of a 5,000-trial table.
_KEPT_MINIMUM = f"""
SELECT c.trial_id, c.vmin, c.n FROM curve_stats c JOIN trials t ON t.id = c.trial_id
WHERE t.study_id = :study_id AND t.status IN {load.ENDED} AND c.attempt = t.attempt AND c.name = :name
"""


def _admits(t: TrialSummary, query: TableQuery, filters: Sequence[tuple[Column, ParamRange]]) -> bool:
    if query.statuses and t.status not in query.statuses:
        return False
    if query.arm and arm_label(t.arm) != query.arm:
        return False
    return all(r.admits(c.value(t)) for c, r in filters)


def _sort_key(t: TrialSummary, key: str, sign: float, times: Mapping[int, tuple[Any, Any]]) -> tuple[Any, ...]:
    started, finished = times.get(t.id, (None, None))
    if key == "objective":  # best first in the study's mode, then the trials judged infeasible; no objective last
        value = sign * t.objective if t.objective is not None else 0.0
        return (t.objective is None, t.infeasible, value, t.number)
    if key in ("started_at", "finished_at"):
        at = started if key == "started_at" else finished
        return (at is None, at.timestamp() if at is not None else 0.0, t.number)
    if key == "duration":
        d = (finished - started).total_seconds() if started and finished else None
        return (d is None, d or 0.0, t.number)
    value = getattr(t, key)
    return (value is None, value if value is not None else 0, t.number)


def reason(t: TrialSummary) -> str | None:
    """Why a failed or infeasible trial is: the divergence the analysis found, else the error it
    reported (its first line), else its fail kind; None for any other trial."""
    if not (t.status == "failed" or t.infeasible):
        return None
    if t.diverged:
        return t.diverged
    if t.error:
        first = t.error.strip().splitlines()[0] if t.error.strip() else ""
        return first[:REASON_CHARS] or t.fail_kind
    return t.fail_kind or ("no finite objective" if t.status == "completed" else t.status)


def _row(t: TrialSummary, times: tuple[Any, Any], cols: Sequence[Column]) -> dict[str, Any]:
    started, finished = times
    duration = (finished - started).total_seconds() if started and finished else None
    return {
        "id": t.id,
        "status": t.status,
        # the analysis' own judgement (divergence.load_trials): a completed trial may be infeasible
        "infeasible": t.infeasible,
        "diverged": t.diverged,
        "outlier": t.outlier,
        "arm": arm_label(t.arm),
        "objective": t.objective,
        "best_step": t.best_step,
        "replica_of": t.replica_of,
        "fail_kind": t.fail_kind,
        "reason": reason(t),
        "values": {c.label: c.value(t) for c in cols},
        "params": dict(t.params),
        "started_at": started.isoformat() if started else None,
        "duration_seconds": duration,
    }
