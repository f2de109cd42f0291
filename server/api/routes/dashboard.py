"""The dashboard's pages: the studies table (the tracking sheet's columns), a study page (progress,
warnings, the arm comparison, interactive charts, the trial table), a trial page, and a compare
page. Pages hold what the server knows at once (spec, counts, warnings); the charts are drawn in
the browser by Plotly (served from the `plotly` package, no CDN) from the JSON endpoints of
`api/service.py`, and refreshed by polling the cheap progress endpoint while trials run."""

from __future__ import annotations

import importlib.util
import json
import math
import re
import shlex
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Query, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse, Response
from jinja2 import Environment, FileSystemLoader, select_autoescape
from markupsafe import Markup
from starlette.background import BackgroundTask

import hpo.server
from hpo.command_template import expand
from hpo.server.analysis import load
from hpo.server.analysis.model import arm_label, fmt
from hpo.server.analysis.service import kept_analysis, resume_advice
from hpo.server.analysis.tracking import tracking_rows
from hpo.server.api.deps import DatabaseDep, SettingsDep, StudyId, TrialId
from hpo.server.api.routes.pipelines import PipelineId, RoundId
from hpo.server.cache import kept, memo
from hpo.server.dashboard import table
from hpo.server.dashboard.charts import service
from hpo.server.dashboard.charts.report import best_per_arm
from hpo.server.errors import InvalidInput, NotFound
from hpo.server.rounds import evidence, pipelines
from hpo.server.schemas import TrialCounts
from hpo.server.studies import notes
from hpo.server.studies import service as studies
from hpo.server.trials import reads as trials
from hpo.server.trials import worker_health

router = APIRouter(include_in_schema=False)

_HERE = Path(hpo.server.__file__).resolve().parent  # templates/ and static/ sit in the package's root
_ENV = Environment(loader=FileSystemLoader(_HERE / "templates"), autoescape=select_autoescape(["html"]))
_STATIC = _HERE / "static"
_STATIC_TYPES = {".css": "text/css", ".js": "text/javascript", ".svg": "image/svg+xml", ".png": "image/png"}
REPORT_PLOTS = (
    ("axis", "Objective against each varied hyperparameter"),
    ("isolation", "Best trial per scientific value"),
    ("curves", "Training curves of the best trials"),
    ("grad_norm", "Unclipped gradient norm"),
    ("best_steps", "Where the best step falls"),
    ("budget", "Best of k trials (playbook Figure 3)"),
)
_PROGRESS_ORDER = ("completed", "infeasible", "failed", "cancelled", "running")
MAX_COMPARED = 8


@router.get("/", response_class=HTMLResponse)
def index(db: DatabaseDep, request: Request) -> HTMLResponse:
    base = str(request.base_url).rstrip("/")
    views = {s.id: s for s in studies.list_studies(db, limit=10_000).items}
    rows = []
    for row in reversed(tracking_rows(db, base)):
        view = views.get(row["id"])
        if view is not None:
            rows.append({**row, "status": view.status, "progress": progress(view.trial_counts)})
    lines = pipelines.list_pipelines(db, limit=100)["items"]
    # The workers' own health reports of the last hour (docs/workers.md, "Worker health").
    workers = worker_health.recent(db)
    return _page("index.html", rows=rows, base_url=base, pipelines=lines, workers=workers)


@router.get("/studies/{study_id}", response_class=HTMLResponse)
def study_page(db: DatabaseDep, request: Request, study_id: StudyId) -> HTMLResponse:
    """The page at once; the analysis' warnings and arm comparison are in it when the analysis of
    this study version was already computed, else the page fetches them (`analysis-sections`), so
    a big study's first visit does not wait seconds for the checklist before drawing anything. The
    page does not show the best trial, so it does not wait for the divergence judgement either."""
    study = studies.get_study(db, study_id, best=False)
    with db.transaction() as session:
        labels = sorted({arm_label(arm) for arm in load.arms_of(session, study_id)})
    page = _page(
        "study.html",
        **_analysis_context(db, study, memo.peek(db, study_id, "analysis")),
        progress=progress(study.trial_counts),
        spec_by_role=spec_by_role(study.spec),
        trainer=study.spec.get("trainer") or {},
        report_plots=REPORT_PLOTS,
        note=notes.get_note(db, study_id=study_id),
        arm_labels=labels,
        table_columns=[c.public() for c in table.columns(study.spec)],
        can_write=can_write(request),
        round_id=study.spec.get("round_id"),
        pipeline_id=study.spec.get("pipeline_id"),
        first_screen=kept.FIRST_SCREEN,
    )
    # After the answer: the charts the page is about to ask for start from these summaries.
    page.background = BackgroundTask(service.warm, db, study_id)
    return page


@router.get("/studies/{study_id}/analysis-sections", response_class=HTMLResponse)
def study_analysis_sections(db: DatabaseDep, request: Request, study_id: StudyId) -> HTMLResponse:
    """The study page's warnings and arm comparison, as HTML to insert (see `study_page`)."""
    study = studies.get_study(db, study_id, best=False)
    # The API's kept answer (in the database for any server), held 5 s at a time while trials run.
    analysis = memo.remember(db, study_id, "analysis", lambda: kept_analysis(db, study_id))
    return _page("study_analysis.html", **_analysis_context(db, study, analysis), can_write=can_write(request))


def _analysis_context(db: Any, study: Any, analysis: dict[str, Any] | None) -> dict[str, Any]:
    counts = study.trial_counts
    return {
        "study": study,
        "analysis": analysis,
        "finished": counts.completed + counts.infeasible + counts.failed + counts.cancelled,
        "n_completed": counts.completed,
        "live": study.status == "active" and counts.pending + counts.running > 0,
        "comparison": (analysis or {}).get("comparison"),
        "trial_variance": (analysis or {}).get("trial_variance"),
    }


@router.get("/trials/{trial_id}", response_class=HTMLResponse)
def trial_page(db: DatabaseDep, settings: SettingsDep, request: Request, trial_id: TrialId) -> HTMLResponse:
    trial = trials.get_trial(db, trial_id)
    study = studies.get_study(db, trial.study_id)
    roles = {h["name"]: h.get("role", "") for h in study.spec.get("hyperparameters") or []}
    by_role: dict[str, list[tuple[str, Any]]] = {"scientific": [], "nuisance": [], "fixed": [], "other": []}
    for name, value in trial.params.items():
        by_role.setdefault(roles.get(name) or "other", []).append((name, value))
    shown, hidden = existing_checkpoints(trials.list_checkpoints(db, trial_id), settings.artifact_root)
    return _page(
        "trial.html",
        trial=trial,
        study=study,
        resumed=resumed_mark(db, trial, study.spec),
        params_by_role=by_role,
        checkpoints=shown,
        hidden_checkpoints=hidden,
        reproduce=reproduce_command(study.spec, trial.params, trial.seed, trial.id),
        note=notes.get_note(db, trial_id=trial_id),
        live=trial.status in ("pending", "running"),
        base_url=str(request.base_url).rstrip("/"),
        can_write=can_write(request),
    )


def resumed_mark(db: Any, trial: Any, spec: Mapping[str, Any]) -> dict[str, Any] | None:
    """The trial page's mark of a best value reached in an attempt resumed from a checkpoint
    (docs/analysis.md, "Values from resumed attempts"): the step resumed from and what such a
    value is worth (`resume_advice`: exact for the built-in trainer, a replica suggested for a
    command). None when not resumed."""
    if not trial.resumed:
        return None
    with db.transaction() as session:
        step = load.resume_steps(session, [trial.id]).get(trial.id)
    return {"step": step, "advice": resume_advice(spec.get("trainer") or {}, trial.id)}


@router.get("/pipelines/{pipeline_id}", response_class=HTMLResponse)
def pipeline_page(db: DatabaseDep, pipeline_id: PipelineId) -> HTMLResponse:
    """A pipeline: its baseline, the launch history (drawn from `GET /api/v1/pipelines/{id}`) and
    its rounds with goal, status and decision."""
    return _page("pipeline.html", pipeline=pipelines.get_pipeline(db, pipeline_id))


@router.get("/rounds/{round_id}", response_class=HTMLResponse)
def round_page(db: DatabaseDep, round_id: RoundId) -> HTMLResponse:
    """A round: its studies, the candidate against the baseline (replica distributions drawn from
    `GET /api/v1/rounds/{id}`), the verdict, the decision and the recipes' readouts."""
    return _page("round.html", round=evidence.get_round(db, round_id))


@router.get("/compare", response_class=HTMLResponse)
def compare_page(db: DatabaseDep, studies_param: str = Query("", alias="studies", max_length=200)) -> HTMLResponse:
    """Two or more studies side by side: best trial per arm and the best trials' curves."""
    all_studies = studies.list_studies(db, limit=10_000).items
    ids: list[int] = []
    for part in [p for p in studies_param.replace(" ", "").split(",") if p]:
        if not part.isdigit() or not 1 <= int(part) < 2**31:
            raise InvalidInput.one("studies", f"expected comma-separated study ids, got {part!r}")
        ids.append(int(part))
    if len(ids) > MAX_COMPARED:
        raise InvalidInput.one("studies", f"compare at most {MAX_COMPARED} studies at once")
    chosen = [best_per_arm(db, i) for i in dict.fromkeys(ids)]
    return _page("compare.html", chosen=chosen, all_studies=all_studies, ids=[c["id"] for c in chosen])


@router.get("/static/{name}")
def static(name: str) -> Response:
    path = _STATIC / name
    if path.suffix not in _STATIC_TYPES or path.parent != _STATIC or not path.is_file():
        raise NotFound(f"no static file {name}")
    return Response(path.read_bytes(), media_type=_STATIC_TYPES[path.suffix], headers={"Cache-Control": "max-age=300"})


# Third-party browser assets, served from the Python packages that ship them (no CDN, so the
# dashboard and the API docs work offline).
_VENDOR = {
    "plotly.min.js": ("plotly", "package_data/plotly.min.js"),
    # plotly.js's "cartesian" partial bundle (npm plotly.js-cartesian-dist-min, MIT, the version of
    # plotly.min.js above; refreshed by scripts/vendor-plotly): a third of the full bundle to parse,
    # enough for the study page's first charts (docs/decisions.md).
    "plotly-cartesian.min.js": ("hpo.server", "static/vendor/plotly-cartesian.min.js"),
    "swagger-ui-bundle.js": ("fastapi_offline", "static/swagger-ui-bundle.js"),
    "swagger-ui.css": ("fastapi_offline", "static/swagger-ui.css"),
    "redoc.standalone.js": ("fastapi_offline", "static/redoc.standalone.js"),
    "favicon.png": ("fastapi_offline", "static/favicon.png"),
}


@cache
def vendor_file(name: str) -> bytes:
    """The bytes of a vendored asset, read once per process."""
    package, relative = _VENDOR[name]
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise NotFound(f"asset {name}: package {package} is not installed")
    return (Path(next(iter(spec.submodule_search_locations))) / relative).read_bytes()


@router.get("/static/vendor/{name}")
def vendor(name: str) -> Response:
    if name not in _VENDOR:
        raise NotFound(f"no static file vendor/{name}")
    media = _STATIC_TYPES.get(Path(name).suffix, "application/octet-stream")
    # Versioned by the package: a day of caching spares the browser 5 MB of Plotly per page.
    return Response(vendor_file(name), media_type=media, headers={"Cache-Control": "public, max-age=86400"})


@router.get("/docs", response_class=HTMLResponse)
def swagger_docs(request: Request) -> HTMLResponse:
    return get_swagger_ui_html(
        openapi_url=request.app.openapi_url,
        title="hpo API",
        swagger_js_url="/static/vendor/swagger-ui-bundle.js",
        swagger_css_url="/static/vendor/swagger-ui.css",
        swagger_favicon_url="/static/vendor/favicon.png",
    )


@router.get("/redoc", response_class=HTMLResponse)
def redoc_docs(request: Request) -> HTMLResponse:
    return get_redoc_html(
        openapi_url=request.app.openapi_url,
        title="hpo API",
        redoc_js_url="/static/vendor/redoc.standalone.js",
        redoc_favicon_url="/static/vendor/favicon.png",
        with_google_fonts=False,
    )


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


def existing_checkpoints(records: list[Any], artifact_root: Path) -> tuple[list[Any], int]:
    """The checkpoint records whose file still exists, and how many were left out. Only paths
    under this server's artifact root can be checked (others are shown as recorded): the trainer
    prunes all but the best few, and a pruned file cannot be resumed from."""
    root = artifact_root.resolve()
    if not root.is_dir():
        return records, 0
    shown = []
    for c in records:
        uri = str(c.uri)
        path = Path(uri[len("file://") :] if uri.startswith("file://") else uri)
        if not path.is_absolute():
            path = root / path
        try:
            checkable = path.resolve().is_relative_to(root)
        except OSError:
            checkable = False
        if not checkable or path.exists():
            shown.append(c)
    return shown, len(records) - len(shown)


def reproduce_command(spec: Mapping[str, Any], params: Mapping[str, Any], seed: int, trial_id: int) -> str:
    """A shell command that reruns one trial without a server, with its params, trainer and seed:
    `hpo train` for a workload; for a command, the trial's own argv with its values put in, run in
    its workdir (under $HPO_WORKDIR_ROOT, as on a worker) with its `HPO_CONFIG` and `HPO_OUT_DIR`."""
    trainer = dict(spec.get("trainer") or {})
    config = {"params": dict(params), "trainer": trainer, "seed": seed, "objective": spec.get("objective") or {}}
    file, out = f"trial-{trial_id}.json", f"trial-{trial_id}-rerun"
    if not trainer.get("command"):
        return f"echo {shlex.quote(json.dumps(config))} > {file} && hpo train --config {file} --out {out}"
    written = {**config, "resume_from": None}
    # Paths are made absolute by the shell ("$d"), since the command runs in its workdir.
    marks = {"out_dir": "\x00out\x00", "config": "\x00config\x00"}
    argv = expand(trainer["command"], params, {**marks, "seed": str(seed), "resume_from": "", "python": "python"})
    quoted = " ".join(shlex.quote(a) for a in argv)
    quoted = quoted.replace(marks["out_dir"], f"'\"$d/{out}\"'").replace(marks["config"], f"'\"$d/{file}\"'")
    workdir = shlex.quote(str(trainer.get("workdir") or "."))
    env = " ".join(f"{k}={shlex.quote(str(v))}" for k, v in (trainer.get("env") or {}).items())
    return (
        f'd="$PWD" && echo {shlex.quote(json.dumps(written))} > {file} && mkdir -p {out} && '
        f'(cd "${{HPO_WORKDIR_ROOT:-.}}"/{workdir} && HPO_CONFIG="$d/{file}" HPO_OUT_DIR="$d/{out}" '
        f"{env + ' ' if env else ''}{quoted})"
    )


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


def _ci(value: Any) -> str:
    if not isinstance(value, (list, tuple)) or len(value) != 2 or value[0] is None or value[1] is None:
        return "–"
    return f"[{fmt(value[0])}, {fmt(value[1])}]"


def _arm_name(arm: Any) -> str:
    """An arm given as its label or as its scientific values."""
    return arm_label(arm) if isinstance(arm, Mapping) else str(arm)


def _params_text(params: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={fmt(v)}" for k, v in params.items())


def can_write(request: Request) -> bool:
    """Whether the caller may write (the page then shows its controls): no authentication
    configured, or a principal holding `write` (docs/security.md)."""
    principal = getattr(request.state, "principal", None)
    return principal is None or bool(principal.may("write"))


def markdown(text: str | None) -> Markup:
    """A note's Markdown as safe HTML (`notes.render`: raw HTML escaped)."""
    return Markup(notes.render(text))  # noqa: S704 - rendered with html disabled


def replicas_suggested(message: str, default: int = 5) -> int:
    """The replica count a `replicas_recommended` warning names (`About 7 replicas per arm`)."""
    found = re.search(r"About (\d+) replicas", message) or re.search(r'"count": (\d+)', message)
    return int(found.group(1)) if found else default


def _page(template: str, **context: Any) -> HTMLResponse:
    page = _ENV.get_template(template)
    return HTMLResponse(
        page.render(
            fmt=_fmt,
            ci=_ci,
            arm_text=arm_label,
            arm_name=_arm_name,
            params_text=_params_text,
            markdown=markdown,
            replicas_suggested=replicas_suggested,
            **context,
        )
    )
