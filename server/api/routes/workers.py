"""The worker protocol over HTTP (docs/worker-protocol.md, "The lifecycle of a trial")."""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, Request, Response, status
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool

from hpo.policy import ExecutionPolicy
from hpo.server.api.deps import DatabaseDep, SettingsDep, TrialId
from hpo.server.api.wire import metrics_body
from hpo.server.errors import Forbidden
from hpo.server.metrics import ingest
from hpo.server.schemas import (
    CheckpointIn,
    Claim,
    ClaimRequest,
    CompleteRequest,
    FailRequest,
    HeartbeatAnswer,
    LeaseRequest,
    MetricsAccepted,
    MetricsIn,
    WorkerHealthIn,
)
from hpo.server.trials import leases, worker_health

router = APIRouter(prefix="/api/v1", tags=["workers"])
_METRICS_SCHEMA = MetricsIn.model_json_schema()  # self-contained: its $defs travel with it


@router.post("/workers/claim", response_model=Claim, responses={204: {"description": "no trial fits"}})
def claim(request: Request, db: DatabaseDep, settings: SettingsDep, body: ClaimRequest) -> Response:
    offered = body.resources
    if body.capabilities is None:
        answer = leases.claim(db, body.worker_id, offered.cpus, offered.gpus, settings.lease_seconds)
    else:
        policy = ExecutionPolicy(
            workload_globs=tuple(body.capabilities.workloads),
            command_prefixes=tuple(tuple(p) for p in body.capabilities.commands),
            env_globs=tuple(body.capabilities.env),
        )
        answer = leases.claim_runnable(
            db,
            body.worker_id,
            offered.cpus,
            offered.gpus,
            settings.lease_seconds,
            lambda _study_id, trainer: _runs(policy, trainer),
        )
    if answer is None:
        return Response(status_code=status.HTTP_204_NO_CONTENT)
    auth = request.app.state.auth
    if auth.enabled():
        # What the trial process carries instead of the worker's token (hpo.server.auth.tokens).
        answer = answer.model_copy(update={"trial_token": auth.trial_token(answer.trial_id, answer.lease_id)})
    # Already a validated Claim: serialized directly, without FastAPI validating it a second time.
    return Response(answer.model_dump_json(), media_type="application/json")


# Whether a policy runs a trainer is asked once per (policy, trainer settings); bounded, since a
# fleet has few policies and a server sees few distinct trainers. Keyed by the settings themselves,
# not the study id: an id names another study in another database (a test's, a restored one).
_RUNS: dict[tuple[ExecutionPolicy, str], bool] = {}
_RUNS_LIMIT = 4096


def _runs(policy: ExecutionPolicy, trainer: dict[str, Any]) -> bool:
    key = (policy, json.dumps(trainer, sort_keys=True, default=str))
    known = _RUNS.get(key)
    if known is None:
        if len(_RUNS) >= _RUNS_LIMIT:
            _RUNS.clear()
        known = _RUNS[key] = policy.trainer_refusal(trainer) is None
    return known


@router.post("/trials/{trial_id}/heartbeat", response_model=HeartbeatAnswer)
def heartbeat(db: DatabaseDep, settings: SettingsDep, trial_id: TrialId, body: LeaseRequest) -> HeartbeatAnswer:
    return leases.heartbeat(db, trial_id, body.lease_id, settings.lease_seconds)


@router.post(
    "/trials/{trial_id}/metrics",
    response_model=MetricsAccepted,
    openapi_extra={"requestBody": {"required": True, "content": {"application/json": {"schema": _METRICS_SCHEMA}}}},
)
async def metrics(request: Request, db: DatabaseDep, trial_id: TrialId) -> Response:
    # The hot path of ingest: the raw bytes parsed and validated in one pass (msgspec for the
    # common body, else pydantic: hpo.server.api.wire); errors still become the one 422 shape
    # through RequestValidationError.
    try:
        body = metrics_body(await request.body())
    except ValidationError as exc:
        raise RequestValidationError([{**e, "loc": ("body", *e["loc"])} for e in exc.errors()]) from None
    _check_trial_token(request, body.lease_id)
    quota = request.app.state.server_settings.max_points_per_trial
    answer = await run_in_threadpool(ingest.record_metrics, db, trial_id, body.lease_id, body.points, quota)
    return Response(answer.model_dump_json(), media_type="application/json")


@router.post("/trials/{trial_id}/checkpoints", status_code=status.HTTP_201_CREATED)
def checkpoint(request: Request, db: DatabaseDep, trial_id: TrialId, body: CheckpointIn) -> dict[str, int]:
    _check_trial_token(request, body.lease_id)
    return {"checkpoint_id": ingest.record_checkpoint(db, trial_id, body.lease_id, body)}


def _check_trial_token(request: Request, lease_id: str) -> None:
    """A trial token writes only under the lease it was issued for. With the write's own fencing
    (that lease must be the running trial's current one, else 409, checked in the write's
    transaction), the token stops working when its attempt ends, at no extra query."""
    principal = getattr(request.state, "principal", None)
    if principal is not None and principal.role == "trial" and principal.lease_id != lease_id:
        raise Forbidden(f"this trial token belongs to lease {principal.lease_id}, not {lease_id}")


@router.post("/trials/{trial_id}/complete")
def complete(db: DatabaseDep, trial_id: TrialId, body: CompleteRequest) -> dict[str, str]:
    leases.complete(db, trial_id, body.lease_id, body.unread_params)
    return {"status": "completed"}


@router.post("/workers/health", status_code=status.HTTP_204_NO_CONTENT)
def health(db: DatabaseDep, body: WorkerHealthIn) -> Response:
    """A worker's report of its own health: a worker that cannot write its artifact root stops
    claiming and says why (docs/workers.md, "Worker health"); `/metrics` and the dashboard show it."""
    worker_health.report(db, body.worker_id, body.healthy, body.reason)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.post("/trials/{trial_id}/fail")
def fail(db: DatabaseDep, trial_id: TrialId, body: FailRequest) -> dict[str, str]:
    return {"status": leases.fail(db, trial_id, body.lease_id, body.kind, body.reason, body.step, body.unread_params)}
