"""The data of the dashboard's interactive charts: one function per chart, each answering exactly
what the browser draws (plain JSON-ready dicts), loaded in one transaction with small queries.

Hover text names the trial (`trial <id>`, the id that every URL uses) with its params and value;
`ids` lists the trial id of every point so a click opens `/trials/<id>`. Curves are downsampled in
the database (one averaged point per step bucket), so 1,000 trials' curves stay a few tens of
thousands of points; y limits are robust (Tukey fences, in log space for losses) so one divergent
trial cannot flatten the rest (playbook, "Examining the training curves")."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from typing import Any, Literal, get_args

from sqlalchemy.orm import Session

from hpo.server.analysis import load
from hpo.server.analysis.importance import study_importance
from hpo.server.analysis.service import kept_analysis
from hpo.server.cache import kept as kept_charts
from hpo.server.cache import memo
from hpo.server.dashboard.charts.axes import axis_chart, parallel_chart
from hpo.server.dashboard.charts.common import trial_summaries
from hpo.server.dashboard.charts.contour import contour_chart
from hpo.server.dashboard.charts.curves import CURVE_POINTS, CURVES_SHOWN, curves_chart
from hpo.server.dashboard.charts.encoding import dumps
from hpo.server.dashboard.charts.progress import history_chart, progress_chart
from hpo.server.dashboard.charts.report import best_steps_chart, budget_chart, grad_norm_chart, isolation_chart
from hpo.server.dashboard.charts.timeline import timeline_chart
from hpo.server.db import Database
from hpo.server.errors import NotFound

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
# The chart endpoint's options when the request names none (the study page's first requests).
PAGE_OPTIONS: dict[str, Any] = {
    "metric": None, "limit": CURVES_SHOWN, "points": CURVE_POINTS, "arm": None, "x": None, "y": None
}  # fmt: skip


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


# --- every chart by its kind -------------------------------------------------------------------


_CHARTS: dict[str, Callable[[Session, load.StudyInfo, dict[str, Any]], dict[str, Any]]] = {
    "progress": progress_chart,
    "history": history_chart,
    "axis": axis_chart,
    "parallel": parallel_chart,
    "contour": contour_chart,
    "importance": lambda session, study, options: study_importance(session, study, options.get("arm") or None),
    "curves": curves_chart,
    "grad_norm": lambda *_: {},
    "isolation": lambda *_: {},
    "best_steps": lambda *_: {},
    "budget": lambda *_: {},
    "timeline": timeline_chart,
}
_FROM_PLOTDATA: dict[str, Callable[[Database, int, dict[str, Any]], dict[str, Any]]] = {
    "grad_norm": grad_norm_chart,
    "isolation": isolation_chart,
    "best_steps": best_steps_chart,
    "budget": budget_chart,
}
