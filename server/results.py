"""What workers report while a trial runs: metric points (idempotent batch upserts, within the
per-trial quota) and checkpoint records, each fenced by the trial's current lease."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import delete, func, select, text
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from . import objective
from .db import Database
from .errors import LeaseLost, NotFound, QuotaExceeded
from .models import Checkpoint, MetricPoint, Study, Trial, TrialStatus
from .schemas import CheckpointIn, MetricPointIn, MetricsAccepted
from .values import to_storage

# One statement for the whole batch: arrays in, so Postgres parses and plans once however many
# points come (several times faster than executemany). Names go once each, points refer to them by
# (1-based) index: a batch holds a few names thousands of times.
_PG_INSERT = """
    INSERT INTO metric_points (trial_id, name, step, value, nonfinite)
    SELECT :trial_id, (CAST(:names AS text[]))[p.name_index], p.step, p.value, p.nonfinite
    FROM unnest(CAST(:name_indexes AS integer[]), CAST(:steps AS integer[]), CAST(:values AS double precision[]),
                CAST(:nonfinite AS smallint[])) AS p(name_index, step, value, nonfinite)
    ON CONFLICT (trial_id, name, step) DO
"""
# New points only (its row count is how many the batch added, for the quota), then, only when some
# were already there (a replay), every point again to overwrite them: the common batch costs one
# statement, as a plain upsert did.
_PG_INSERT_NEW = text(_PG_INSERT + " NOTHING")
_PG_UPSERT = text(_PG_INSERT + " UPDATE SET value = EXCLUDED.value, nonfinite = EXCLUDED.nonfinite")


def record_metrics(
    db: Database, trial_id: int, lease_id: str, points: Sequence[MetricPointIn], max_points: int | None = None
) -> MetricsAccepted:
    """Upserts the points on (trial, name, step): replaying a step overwrites instead of
    duplicating; within one batch the last point for a (name, step) wins. NaN and infinities are
    stored as data. Refreshes the objective when the batch carries the objective metric.
    `QuotaExceeded`, storing nothing of the batch, when the trial would hold more than
    `max_points` points (points it already holds, replayed, do not count again)."""
    latest = {(p.name, p.step): p.value for p in points}
    with db.transaction() as session:
        # Locked exclusively (not shared like the other writes): the point count is updated below,
        # and two batches of one trial that each held a shared lock would deadlock upgrading it.
        trial, study = _fenced(session, trial_id, lease_id, exclusive=True)
        if latest:
            added = _upsert(session, db, trial_id, latest)
            _count_points(session, trial, added, len(latest), max_points)
        if any(name == study.objective_metric for name, _ in latest):
            value, step = objective.refresh(session, trial_id, study.objective_metric, study.objective_mode)
        else:
            value, step = trial.objective_value, trial.best_step
        return MetricsAccepted(accepted=len(latest), objective_value=value, best_step=step)


def record_checkpoint(db: Database, trial_id: int, lease_id: str, checkpoint: CheckpointIn) -> int:
    """Records a checkpoint of the current attempt (idempotent on its step); answers its id."""
    with db.transaction() as session:
        trial, _ = _fenced(session, trial_id, lease_id)
        row = session.scalar(
            select(Checkpoint).where(
                Checkpoint.trial_id == trial_id, Checkpoint.attempt == trial.attempt, Checkpoint.step == checkpoint.step
            )
        )
        if row is None:
            row = Checkpoint(trial_id=trial_id, attempt=trial.attempt, step=checkpoint.step, uri=checkpoint.uri)
            session.add(row)
        row.uri, row.objective = checkpoint.uri, checkpoint.objective
        gone = [s for s in checkpoint.deleted_steps if s != checkpoint.step]
        if gone:
            # The server lists only checkpoints whose files exist (retention deleted these).
            session.execute(
                delete(Checkpoint).where(
                    Checkpoint.trial_id == trial_id, Checkpoint.attempt == trial.attempt, Checkpoint.step.in_(gone)
                )
            )
        session.flush()
        return row.id


def _fenced(session: Session, trial_id: int, lease_id: str, *, exclusive: bool = False) -> tuple[Trial, Study]:
    """The running trial and its study, locked so a concurrent claim waits for this write."""
    found = session.execute(
        select(Trial, Study)
        .join(Study, Study.id == Trial.study_id)
        .where(Trial.id == trial_id)
        .with_for_update(read=not exclusive, of=Trial)
    ).first()
    if found is None:
        raise NotFound(f"trial {trial_id} not found")
    trial, study = found
    if trial.lease_id != lease_id or trial.status is not TrialStatus.running:
        raise LeaseLost(f"lease {lease_id} is not the current lease of running trial {trial_id}; stop this run")
    return trial, study


def _count_points(session: Session, trial: Trial, added: int, batch: int, max_points: int | None) -> None:
    """Keeps `trial.point_count`, refusing a batch that would take it past `max_points`."""
    if trial.point_count is None:  # a trial from before points were counted: counted once, now
        query = select(func.count()).select_from(MetricPoint).where(MetricPoint.trial_id == trial.id)
        total = int(session.scalar(query) or 0)
    else:
        total = trial.point_count + added
    if max_points is not None and total > max_points:
        raise QuotaExceeded(
            f"trial {trial.id} would hold {total:,} metric points, over the limit of {max_points:,} per trial "
            f"(HPO_MAX_POINTS_PER_TRIAL); none of this batch's {batch:,} points was stored"
        )
    if total != trial.point_count:
        trial.point_count = total


def _upsert(session: Session, db: Database, trial_id: int, latest: dict[tuple[str, int], float]) -> int:
    """Stores the points; answers how many were new."""
    stored = [to_storage(v) for v in latest.values()]
    if not db.is_sqlite:
        names: dict[str, int] = {}
        indexes = [names.setdefault(name, len(names) + 1) for name, _ in latest]
        arrays = {
            "trial_id": trial_id,
            "names": list(names),
            "name_indexes": indexes,
            "steps": [step for _, step in latest],
            "values": [value for value, _ in stored],
            "nonfinite": [int(flag) for _, flag in stored],
        }
        added = _rowcount(session.execute(_PG_INSERT_NEW, arrays))
        if added < len(latest):
            session.execute(_PG_UPSERT, arrays)
        return added
    rows = [
        {"trial_id": trial_id, "name": name, "step": step, "value": value, "nonfinite": int(flag)}
        for (name, step), (value, flag) in zip(latest, stored, strict=True)
    ]
    statement = sqlite_insert(MetricPoint)
    # Core execution (the ORM's bulk insert answers no row count); sqlite3 sums executemany's
    # row counts, and ignored conflicts count none.
    connection = session.connection()
    added = _rowcount(connection.execute(statement.on_conflict_do_nothing(), rows))
    if added < len(rows):
        update = {"value": statement.excluded.value, "nonfinite": statement.excluded.nonfinite}
        connection.execute(
            statement.on_conflict_do_update(index_elements=["trial_id", "name", "step"], set_=update), rows
        )
    return added


def _rowcount(result: Any) -> int:
    return int(result.rowcount or 0)
