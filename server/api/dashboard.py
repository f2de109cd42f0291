"""The server-rendered dashboard: the studies table (the tracking sheet's columns), a study page
(spec by role, progress, warnings, plots) and a trial page (params, curves, checkpoints). Pages
read through the same services as the JSON API; plots are the API's SVGs."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response
from jinja2 import Environment, FileSystemLoader, select_autoescape

from .. import studies, trials
from ..analysis.model import arm_label, fmt
from ..analysis.service import analyze_study
from ..analysis.tracking import tracking_rows
from ..errors import NotFound
from ..schemas import TrialCounts
from .deps import DatabaseDep, StudyId, TrialId

router = APIRouter(include_in_schema=False)

_HERE = Path(__file__).resolve().parent.parent
_ENV = Environment(loader=FileSystemLoader(_HERE / "templates"), autoescape=select_autoescape(["html"]))
_STATIC = _HERE / "static"
_STATIC_TYPES = {".css": "text/css", ".js": "text/javascript", ".svg": "image/svg+xml", ".png": "image/png"}
PLOTS = (
    ("axis", "Objective against each varied hyperparameter; red crosses are infeasible trials"),
    ("isolation", "Best trial per scientific value (nuisance optimized away); error bars from replicas"),
    ("curves", "Training curves of the best trials of each arm; * best step, | checkpoints"),
    ("grad_norm", "Unclipped gradient norm of each arm's best trial, and its 90th percentile"),
    ("best_steps", "Where retrospective checkpoint selection finds the best step"),
    ("budget", "Best of k trials drawn from the study (playbook Figure 3)"),
)
_PROGRESS_ORDER = ("completed", "infeasible", "failed", "cancelled", "running")


@router.get("/", response_class=HTMLResponse)
def index(db: DatabaseDep, request: Request) -> HTMLResponse:
    base = str(request.base_url).rstrip("/")
    views = {s.id: s for s in studies.list_studies(db, limit=10_000).items}
    rows = []
    for row in reversed(tracking_rows(db, base)):
        view = views.get(row["id"])
        if view is not None:
            rows.append({**row, "status": view.status, "progress": progress(view.trial_counts)})
    return _page("index.html", rows=rows, base_url=base)


@router.get("/studies/{study_id}", response_class=HTMLResponse)
def study_page(db: DatabaseDep, study_id: StudyId) -> HTMLResponse:
    study = studies.get_study(db, study_id)
    analysis = analyze_study(db, study_id)
    top = trials.list_trials(db, study_id, order_by="objective", limit=20).items
    counts = study.trial_counts
    live = study.status == "active" and counts.pending + counts.running > 0
    return _page(
        "study.html",
        study=study,
        analysis=analysis,
        progress=progress(counts),
        spec_by_role=spec_by_role(study.spec),
        trainer=study.spec.get("trainer") or {},
        plots=PLOTS,
        top_trials=top,
        refresh=30 if live else None,
    )


@router.get("/trials/{trial_id}", response_class=HTMLResponse)
def trial_page(db: DatabaseDep, request: Request, trial_id: TrialId) -> HTMLResponse:
    trial = trials.get_trial(db, trial_id)
    study = studies.get_study(db, trial.study_id)
    roles = {h["name"]: h.get("role", "") for h in study.spec.get("hyperparameters") or []}
    return _page(
        "trial.html",
        trial=trial,
        study=study,
        roles=roles,
        checkpoints=trials.list_checkpoints(db, trial_id),
        base_url=str(request.base_url).rstrip("/"),
    )


@router.get("/static/{name}")
def static(name: str) -> Response:
    path = _STATIC / name
    if path.suffix not in _STATIC_TYPES or path.parent != _STATIC or not path.is_file():
        raise NotFound(f"no static file {name}")
    return Response(path.read_bytes(), media_type=_STATIC_TYPES[path.suffix], headers={"Cache-Control": "max-age=300"})


def progress(counts: TrialCounts) -> dict[str, Any]:
    """Segments of a progress bar: the share of trials in each finished or running state."""
    data = counts.model_dump()
    total = sum(data.values())
    parts = [{"status": s, "percent": round(100 * data[s] / total, 2)} for s in _PROGRESS_ORDER if total and data[s]]
    finished = total - data["pending"] - data["running"]
    return {"total": total, "finished": finished, "parts": parts}


def spec_by_role(spec: Mapping[str, Any]) -> dict[str, list[dict[str, str]]]:
    """The spec's hyperparameters grouped by role, each with a readable range and condition."""
    out: dict[str, list[dict[str, str]]] = {"scientific": [], "nuisance": [], "fixed": []}
    for h in spec.get("hyperparameters") or []:
        when = ", ".join(f"{k} in {list(v)}" for k, v in (h.get("when") or {}).items())
        out.setdefault(h.get("role", "nuisance"), []).append({"name": h["name"], "range": _range(h), "when": when})
    return out


def _range(h: Mapping[str, Any]) -> str:
    if h.get("role") == "fixed":
        return fmt(h.get("value"))
    if h.get("type") in ("categorical", "discrete"):
        return "{" + ", ".join(fmt(v) for v in h.get("values") or []) + "}"
    return f"[{fmt(h.get('min'))}, {fmt(h.get('max'))}] {h.get('scale') or 'linear'}"


def _fmt(value: Any) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "–"
    return fmt(value)


def _params_text(params: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={fmt(v)}" for k, v in params.items())


def _page(template: str, **context: Any) -> HTMLResponse:
    page = _ENV.get_template(template)
    return HTMLResponse(page.render(fmt=_fmt, arm_text=arm_label, params_text=_params_text, **context))
