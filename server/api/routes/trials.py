"""Trial routes for people: read a trial, its metrics and checkpoints; cancel; replicate."""

from __future__ import annotations

from fastapi import APIRouter, Query, status

from hpo.server.api.deps import DatabaseDep, TrialId
from hpo.server.schemas import CheckpointPublic, Page, ReplicasRequest, TrialPublic
from hpo.server.trials import leases
from hpo.server.trials import reads as trials

router = APIRouter(prefix="/api/v1/trials", tags=["trials"])


@router.get("/{trial_id}", response_model=TrialPublic)
def get_trial(db: DatabaseDep, trial_id: TrialId) -> TrialPublic:
    return trials.get_trial(db, trial_id)


@router.get("/{trial_id}/metrics", response_model=Page)
def get_metrics(
    db: DatabaseDep,
    trial_id: TrialId,
    name: str | None = Query(None, max_length=200),
    limit: int = Query(10_000, ge=1, le=100_000),
    offset: int = Query(0, ge=0, le=2**31 - 1),
) -> Page:
    return trials.list_metrics(db, trial_id, name=name, limit=limit, offset=offset)


@router.get("/{trial_id}/checkpoints", response_model=list[CheckpointPublic])
def get_checkpoints(db: DatabaseDep, trial_id: TrialId) -> list[CheckpointPublic]:
    return trials.list_checkpoints(db, trial_id)


@router.post("/{trial_id}/cancel", response_model=TrialPublic)
def cancel(db: DatabaseDep, trial_id: TrialId) -> TrialPublic:
    leases.cancel(db, trial_id)
    return trials.get_trial(db, trial_id)


@router.post("/{trial_id}/replicas", status_code=status.HTTP_201_CREATED)
def replicas(db: DatabaseDep, trial_id: TrialId, body: ReplicasRequest) -> dict[str, list[int]]:
    return {"trial_ids": trials.create_replicas(db, trial_id, body.count)}


@router.post("/{trial_id}/retry", status_code=status.HTTP_201_CREATED)
def retry(db: DatabaseDep, trial_id: TrialId) -> dict[str, list[int]]:
    """Runs a failed trial again as a new trial (same params and seed, a fresh attempt budget)."""
    return {"trial_ids": trials.retry(db, trial_id)}
