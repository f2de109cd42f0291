"""Liveness, readiness and Prometheus metrics."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse, PlainTextResponse
from sqlalchemy import func, select

from hpo.server.api.deps import DatabaseDep
from hpo.server.models import Study, Trial
from hpo.server.trials import worker_health

router = APIRouter(tags=["health"])


@router.get("/healthz")
async def healthz() -> dict[str, str]:  # async: answered on the event loop, never queued for a thread
    # `service` lets a client tell hpo from another program on the same port (hpo/server_url.py).
    return {"status": "ok", "service": "hpo"}


@router.get("/readyz")
def readyz(db: DatabaseDep) -> JSONResponse:
    if db.ping():
        return JSONResponse({"status": "ready", "database": "reachable"})
    return JSONResponse({"status": "not ready", "database": "unreachable"}, status_code=503)


@router.get("/metrics", response_class=PlainTextResponse)
def prometheus(db: DatabaseDep) -> str:
    """Trials by status and studies by status, in Prometheus' text format."""
    with db.transaction() as session:
        trials = session.execute(select(Trial.status, func.count()).group_by(Trial.status)).all()
        studies = session.execute(select(Study.status, func.count()).group_by(Study.status)).all()
    lines = ["# HELP hpo_trials Trials by status.", "# TYPE hpo_trials gauge"]
    lines += [f'hpo_trials{{status="{status.value}"}} {count}' for status, count in trials]
    lines += ["# HELP hpo_studies Studies by stored status.", "# TYPE hpo_studies gauge"]
    lines += [f'hpo_studies{{status="{status.value}"}} {count}' for status, count in studies]
    lines += ["# HELP hpo_worker_healthy Workers' own reports of the last hour: 1 healthy, 0 not."]
    lines += ["# TYPE hpo_worker_healthy gauge"]
    reports = worker_health.recent(db)
    lines += [f'hpo_worker_healthy{{worker="{_label(r.worker_id)}"}} {int(r.healthy)}' for r in reports]
    return "\n".join(lines) + "\n"


def _label(value: str) -> str:
    """A Prometheus label value: backslash, quote and newline escaped (a worker names itself)."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
