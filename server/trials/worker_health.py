"""Workers' own reports of their health (docs/workers.md, "Worker health").

A worker that cannot write its artifact root (a full or read-only disk) stops claiming and says so
here, so the operator sees it on `/metrics` and the dashboard instead of in a trail of failed
trials. A report overwrites the worker's previous one; reports older than `RECENT` are left out
of what is shown (the worker is gone, or was renamed)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from sqlalchemy import delete, select

from hpo.server.db import Database
from hpo.server.models import WorkerHealth

RECENT = timedelta(hours=1)


@dataclass(frozen=True)
class HealthReport:
    worker_id: str
    healthy: bool
    reason: str | None
    reported_at: datetime


def report(db: Database, worker_id: str, healthy: bool, reason: str | None) -> None:
    """Keeps the worker's newest report (one row per worker)."""
    with db.transaction() as session:
        session.execute(delete(WorkerHealth).where(WorkerHealth.worker_id == worker_id))
        session.add(WorkerHealth(worker_id=worker_id, healthy=healthy, reason=(reason or None)))


def recent(db: Database) -> list[HealthReport]:
    """The reports of the last hour, unhealthy workers first (one row per worker: few rows, so the
    age is judged here, the same on both databases)."""
    since = datetime.now(timezone.utc) - RECENT
    with db.transaction() as session:
        rows = session.execute(select(WorkerHealth).order_by(WorkerHealth.healthy, WorkerHealth.worker_id)).scalars()
        reports = [HealthReport(r.worker_id, r.healthy, r.reason, _utc(r.reported_at)) for r in rows]
    return [r for r in reports if r.reported_at >= since]


def _utc(moment: datetime) -> datetime:
    """SQLite gives back naive UTC times."""
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=timezone.utc)
