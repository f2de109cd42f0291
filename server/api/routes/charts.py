"""JSON for the dashboard: one endpoint per chart (exactly what it draws), the trial table, a
trial's curves, and notes. Reads are cheap enough to poll; a note is written with PUT."""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Body, Query, Request, Response
from pydantic import BaseModel, Field

from hpo.server.api.deps import DatabaseDep, StudyId, TrialId
from hpo.server.auth import tokens as auth
from hpo.server.cache import memo
from hpo.server.dashboard.charts import curves, service
from hpo.server.dashboard.charts.service import ChartKind
from hpo.server.dashboard.table import SORT_KEYS, TableQuery, parse_param_filters, trial_table
from hpo.server.studies import notes

router = APIRouter(prefix="/api/v1", tags=["dashboard"])

Status = Literal["pending", "running", "completed", "infeasible", "failed", "cancelled"]


class NoteIn(BaseModel):
    body: str = Field(max_length=notes.MAX_NOTE_CHARS, description="the note's whole text (replaces the old one)")


class NoteOut(BaseModel):
    body: str
    updated_at: str | None = Field(description="when it was last saved (ISO 8601, UTC)")
    author: str | None = Field(
        description="the name of the token that saved it last (a dashboard session's: the token it signed in "
        "with; `HPO_API_TOKEN` for that one); null without authentication"
    )
    html: str = Field(description="the body rendered as Markdown (CommonMark, raw HTML escaped)")


class NotePreview(BaseModel):
    html: str


@router.post("/notes/preview", response_model=NotePreview)
def preview_note(note: NoteIn = Body(...)) -> dict[str, Any]:
    """How a note's Markdown renders, without saving it (the note editor's Preview)."""
    return {"html": notes.render(note.body)}


@router.get(
    "/studies/{study_id}/charts/{kind}", response_class=Response, responses={200: {"content": {"application/json": {}}}}
)
def get_chart(
    db: DatabaseDep,
    study_id: StudyId,
    kind: ChartKind,
    metric: str | None = Query(None, max_length=200, description="curves: the metric (default the objective)"),
    limit: int = Query(
        curves.CURVES_SHOWN, ge=1, le=curves.MAX_CURVES, description="curves: at most this many trials, best first"
    ),
    points: int = Query(curves.CURVE_POINTS, ge=2, le=2000, description="curves: points per curve after downsampling"),
    arm: str | None = Query(
        None, max_length=500, description="curves, importance, contour: only this arm (its label, `optimizer=adam`)"
    ),
    x: str | None = Query(
        None, max_length=200, description="contour: the x hyperparameter (label or unambiguous name)"
    ),
    y: str | None = Query(
        None, max_length=200, description="contour: the y hyperparameter (label or unambiguous name)"
    ),
) -> Response:
    """The data of one dashboard chart; hover texts name each point's trial and `ids` its trial id."""
    options = {"metric": metric, "limit": limit, "points": points, "arm": arm, "x": x, "y": y}
    body = service.chart_json(db, study_id, kind, options)
    return Response(body, media_type="application/json", headers={"Cache-Control": "no-cache"})


@router.get("/studies/{study_id}/table")
def get_table(
    db: DatabaseDep,
    study_id: StudyId,
    sort: str = Query(
        "number",
        max_length=300,
        description=f"one of {', '.join(SORT_KEYS)}; param:NAME (a hyperparameter's label, or a name declared once) "
        "or metric:NAME (each trial's best value of that metric)",
    ),
    desc: bool = False,
    status: list[Status] = Query(default_factory=list, description="keep these statuses (repeatable)"),
    arm: str | None = Query(None, max_length=500, description="keep this arm (its label)"),
    param: list[str] = Query(
        default_factory=list, description="NAME:LO:HI (open bounds may be empty) or NAME=VALUE (repeatable)"
    ),
    offset: int = Query(0, ge=0, le=2**31 - 1),
    limit: int = Query(50, ge=1, le=1000),
) -> dict[str, Any]:
    """A page of the study's trial table, sorted and filtered on the server."""
    query = TableQuery(sort, desc, tuple(status), arm, parse_param_filters(param), offset, limit)
    table = dict(memo.remember(db, study_id, ("table", query), lambda: trial_table(db, study_id, query)))
    table["notes"] = {str(k): v for k, v in notes.study_notes(db, study_id).items()}
    return table


@router.get("/trials/{trial_id}/curves")
def get_trial_curves(db: DatabaseDep, trial_id: TrialId, points: int = Query(400, ge=2, le=5000)) -> dict[str, Any]:
    """Every metric of one trial, downsampled, with robust y ranges (log-y for losses)."""
    return curves.trial_curves(db, trial_id, points)


@router.get("/studies/{study_id}/note", response_model=NoteOut)
def get_study_note(db: DatabaseDep, study_id: StudyId) -> dict[str, Any]:
    return notes.get_note(db, study_id=study_id)


@router.put("/studies/{study_id}/note", response_model=NoteOut)
def put_study_note(db: DatabaseDep, request: Request, study_id: StudyId, note: NoteIn = Body(...)) -> dict[str, Any]:
    return notes.set_note(db, note.body, author=_author(db, request), study_id=study_id)


@router.get("/trials/{trial_id}/note", response_model=NoteOut)
def get_trial_note(db: DatabaseDep, trial_id: TrialId) -> dict[str, Any]:
    return notes.get_note(db, trial_id=trial_id)


@router.put("/trials/{trial_id}/note", response_model=NoteOut)
def put_trial_note(db: DatabaseDep, request: Request, trial_id: TrialId, note: NoteIn = Body(...)) -> dict[str, Any]:
    return notes.set_note(db, note.body, author=_author(db, request), trial_id=trial_id)


def _author(db: DatabaseDep, request: Request) -> str | None:
    """Who signs a note: the caller's token name (hpo.server.auth.tokens sets the principal)."""
    return auth.author_name(db, getattr(request.state, "principal", None))
