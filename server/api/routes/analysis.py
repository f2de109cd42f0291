"""Analysis routes: the playbook's checklist as JSON, the plots as SVG or PNG, the tracking sheet."""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Query, Request, Response, status

from hpo.server.analysis.service import kept_analysis
from hpo.server.analysis.tracking import tracking_csv, tracking_rows
from hpo.server.api.deps import DatabaseDep, StudyId
from hpo.server.dashboard import plots
from hpo.server.dashboard.plotdata import plot_data
from hpo.server.schemas import StudyReplicasRequest
from hpo.server.trials.replicas import replicate_best

router = APIRouter(prefix="/api/v1", tags=["analysis"])

PlotKind = Literal["axis", "isolation", "curves", "grad_norm", "best_steps", "budget"]


@router.get("/studies.csv", response_class=Response)
def studies_csv(db: DatabaseDep, request: Request) -> Response:
    """The tracking sheet: study, config link, description, trials run, best validation value,
    reproduction command (plus metric, id and best trial)."""
    body = tracking_csv(tracking_rows(db, str(request.base_url).rstrip("/")))
    headers = {"Content-Disposition": 'inline; filename="studies.csv"'}
    return Response(body, media_type="text/csv; charset=utf-8", headers=headers)


@router.get("/studies/{study_id}/analysis")
def get_analysis(db: DatabaseDep, study_id: StudyId) -> dict[str, Any]:
    return kept_analysis(db, study_id)


@router.post("/studies/{study_id}/replicas", status_code=status.HTTP_201_CREATED)
def post_replicas(db: DatabaseDep, study_id: StudyId, body: StudyReplicasRequest) -> dict[str, Any]:
    """Replicas of the best `per_arm` trials of every arm (`count` each), to measure trial
    variance; replicas never become the study's best. Answers `{trial_ids, sources}`."""
    return replicate_best(db, study_id, body.per_arm, body.count)


@router.get("/studies/{study_id}/plots/{kind}", response_class=Response)
def get_plot(
    db: DatabaseDep,
    study_id: StudyId,
    kind: PlotKind,
    format: Literal["svg", "png"] = "svg",
    trial_id: int | None = Query(None, ge=1, le=2**31 - 1, description="curves or grad_norm of one trial"),
) -> Response:
    body = plots.render(kind, plot_data(db, study_id, kind, trial_id), format)
    return Response(body, media_type=plots.FORMATS[format], headers={"Cache-Control": "no-cache"})
