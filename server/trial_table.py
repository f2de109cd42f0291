"""The dashboard's trial table: every trial of a study, sorted, filtered (status, arm, parameter
ranges) and paged on the server, so a 5,000-trial study answers one page at a time.

Filtering happens over the trial summaries (params are JSON documents, so a range filter is not
portable SQL); a study's summaries are a few milliseconds per thousand trials."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select

from .analysis import queries
from .analysis.model import TrialSummary, arm_label
from .analysis.service import json_safe
from .charts import trial_summaries
from .db import Database
from .errors import FieldError, InvalidInput
from .models import Trial

SORT_KEYS = ("number", "id", "objective", "status", "best_step", "started_at", "finished_at", "duration")
STATUSES = ("pending", "running", "completed", "infeasible", "failed", "cancelled")


@dataclass(frozen=True)
class ParamRange:
    """`name:lo:hi`; an empty bound is open. A categorical filter is `name=value`."""

    name: str
    lo: float | None = None
    hi: float | None = None
    equals: str | None = None

    def admits(self, params: Mapping[str, Any]) -> bool:
        value = params.get(self.name)
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
    for i, text in enumerate(raw):
        if "=" in text and ":" not in text.split("=", 1)[0]:
            name, value = text.split("=", 1)
            out.append(ParamRange(name.strip(), equals=value))
            continue
        parts = text.split(":")
        if len(parts) != 3 or not parts[0]:
            raise InvalidInput.one(f"param[{i}]", f"expected NAME:LO:HI or NAME=VALUE, got {text!r}")
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


def trial_table(db: Database, study_id: int, query: TableQuery) -> dict[str, Any]:
    """`{total, filtered, offset, limit, rows: [...], params: [names], arms: [labels]}`."""
    errors = [
        FieldError("status", f"unknown status {s!r}; one of {list(STATUSES)}")
        for s in query.statuses
        if s not in STATUSES
    ]
    if query.sort not in SORT_KEYS:
        errors.append(FieldError("sort", f"unknown sort key {query.sort!r}; one of {list(SORT_KEYS)}"))
    if errors:
        raise InvalidInput(errors)
    with db.transaction() as session:
        study = queries.study_info(session, study_id)
        trials = trial_summaries(session, study_id)
        times = {
            r.id: (r.started_at, r.finished_at)
            for r in session.execute(
                select(Trial.id, Trial.started_at, Trial.finished_at).where(Trial.study_id == study_id)
            )
        }
    names = sorted({k for t in trials for k in t.params})
    arms = sorted({arm_label(t.arm) for t in trials})
    kept = [t for t in trials if _admits(t, query)]
    sign = 1.0 if study.mode == "min" else -1.0
    kept.sort(key=lambda t: _sort_key(t, query.sort, sign, times), reverse=query.descending)
    if query.descending:  # reversed, but trials without the value stay last
        kept.sort(key=lambda t: _sort_key(t, query.sort, sign, times)[0])
    page = kept[query.offset : query.offset + query.limit]
    rows = [_row(t, times.get(t.id, (None, None))) for t in page]
    return json_safe(
        {
            "total": len(trials),
            "filtered": len(kept),
            "offset": query.offset,
            "limit": query.limit,
            "metric": study.metric,
            "mode": study.mode,
            "params": names,
            "arms": arms,
            "rows": rows,
        }
    )


def _admits(t: TrialSummary, query: TableQuery) -> bool:
    if query.statuses and t.status not in query.statuses:
        return False
    if query.arm and arm_label(t.arm) != query.arm:
        return False
    return all(r.admits(t.params) for r in query.params)


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


def _row(t: TrialSummary, times: tuple[Any, Any]) -> dict[str, Any]:
    started, finished = times
    duration = (finished - started).total_seconds() if started and finished else None
    return {
        "id": t.id,
        "number": t.number,
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
        "params": dict(t.params),
        "started_at": started.isoformat() if started else None,
        "duration_seconds": duration,
    }
