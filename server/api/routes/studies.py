"""Study routes: thin, each validates, calls one service function and returns a schema."""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Body, Query, status

from hpo.server.api.deps import DatabaseDep, SettingsDep, StudyId
from hpo.server.schemas import ManualTrialsIn, Page, StudyCreated, StudyPatch, StudyPublic, StudyRetryRequest
from hpo.server.studies import service as studies
from hpo.server.trials import reads as trials

router = APIRouter(prefix="/api/v1/studies", tags=["studies"])


@router.post("", status_code=status.HTTP_201_CREATED, response_model=StudyCreated)
def create_study(db: DatabaseDep, settings: SettingsDep, spec: Any = Body(...)) -> StudyCreated:
    return studies.create_study(db, spec, settings.execution_policy)


@router.get("", response_model=Page)
def list_studies(
    db: DatabaseDep,
    status: Literal["active", "paused", "archived", "completed"] | None = None,
    limit: int = Query(100, ge=1, le=1000),
    offset: int = Query(0, ge=0, le=2**31 - 1),
) -> Page:
    return studies.list_studies(db, status=status, limit=limit, offset=offset)


@router.get("/{study_id}", response_model=StudyPublic)
def get_study(db: DatabaseDep, study_id: StudyId) -> StudyPublic:
    return studies.get_study(db, study_id)


@router.patch("/{study_id}", response_model=StudyPublic)
def patch_study(db: DatabaseDep, study_id: StudyId, patch: StudyPatch) -> StudyPublic:
    return studies.patch_study(db, study_id, patch)


@router.post("/{study_id}/trials", status_code=status.HTTP_201_CREATED)
def add_trials(db: DatabaseDep, study_id: StudyId, body: ManualTrialsIn) -> dict[str, list[int]]:
    return {"trial_ids": studies.add_manual_trials(db, study_id, body.trials)}


@router.get("/{study_id}/trials", response_model=Page)
def list_trials(
    db: DatabaseDep,
    study_id: StudyId,
    status: Literal["pending", "running", "completed", "infeasible", "failed", "cancelled"] | None = None,
    order_by: Literal["number", "-number", "objective"] = "number",
    limit: int = Query(100, ge=1, le=10_000),
    offset: int = Query(0, ge=0, le=2**31 - 1),
) -> Page:
    return trials.list_trials(db, study_id, status=status, order_by=order_by, limit=limit, offset=offset)


@router.post("/{study_id}/retry", status_code=status.HTTP_201_CREATED)
def retry_failed(db: DatabaseDep, study_id: StudyId, body: StudyRetryRequest) -> dict[str, list[int]]:
    """Runs every failed trial not yet retried again (of one fail kind when given), and resumes a
    study that paused itself over them."""
    return {"trial_ids": trials.retry_study(db, study_id, body.kind)}
