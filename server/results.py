"""What workers report while a trial runs: metric points (idempotent batch upserts) and
checkpoint records, each fenced by the trial's current lease."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import delete, select, text
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from . import objective
from .db import Database
from .errors import LeaseLost, NotFound
from .models import Checkpoint, MetricPoint, Study, Trial, TrialStatus
from .schemas import CheckpointIn, MetricPointIn, MetricsAccepted
from .values import to_storage

# One statement for the whole batch: arrays in, so Postgres parses and plans once however many
# points come (several times faster than executemany). Names go once each, points refer to them by
# (1-based) index: a batch holds a few names thousands of times.
_PG_UPSERT = text(
    """
    INSERT INTO metric_points (trial_id, name, step, value, nonfinite)
    SELECT :trial_id, (CAST(:names AS text[]))[p.name_index], p.step, p.value, p.nonfinite
    FROM unnest(CAST(:name_indexes AS integer[]), CAST(:steps AS integer[]), CAST(:values AS double precision[]),
                CAST(:nonfinite AS smallint[])) AS p(name_index, step, value, nonfinite)
    ON CONFLICT (trial_id, name, step) DO UPDATE SET value = EXCLUDED.value, nonfinite = EXCLUDED.nonfinite
    """
)


def record_metrics(db: Database, trial_id: int, lease_id: str, points: Sequence[MetricPointIn]) -> MetricsAccepted:
    """Upserts the points on (trial, name, step): replaying a step overwrites instead of
    duplicating; within one batch the last point for a (name, step) wins. NaN and infinities are
    stored as data. Refreshes the objective when the batch carries the objective metric."""
    latest = {(p.name, p.step): p.value for p in points}
    with db.transaction() as session:
        trial, study = _fenced(session, trial_id, lease_id)
        if latest:
            _upsert(session, db, trial_id, latest)
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


def _fenced(session: Session, trial_id: int, lease_id: str) -> tuple[Trial, Study]:
    """The running trial and its study, share-locked so a concurrent claim waits for this write."""
    found = session.execute(
        select(Trial, Study)
        .join(Study, Study.id == Trial.study_id)
        .where(Trial.id == trial_id)
        .with_for_update(read=True, of=Trial)
    ).first()
    if found is None:
        raise NotFound(f"trial {trial_id} not found")
    trial, study = found
    if trial.lease_id != lease_id or trial.status is not TrialStatus.running:
        raise LeaseLost(f"lease {lease_id} is not the current lease of running trial {trial_id}; stop this run")
    return trial, study


def _upsert(session: Session, db: Database, trial_id: int, latest: dict[tuple[str, int], float]) -> None:
    stored = [to_storage(v) for v in latest.values()]
    if not db.is_sqlite:
        names: dict[str, int] = {}
        indexes = [names.setdefault(name, len(names) + 1) for name, _ in latest]
        session.execute(
            _PG_UPSERT,
            {
                "trial_id": trial_id,
                "names": list(names),
                "name_indexes": indexes,
                "steps": [step for _, step in latest],
                "values": [value for value, _ in stored],
                "nonfinite": [int(flag) for _, flag in stored],
            },
        )
        return
    rows = [
        {"trial_id": trial_id, "name": name, "step": step, "value": value, "nonfinite": int(flag)}
        for (name, step), (value, flag) in zip(latest, stored, strict=True)
    ]
    statement = sqlite_insert(MetricPoint)
    session.execute(
        statement.on_conflict_do_update(
            index_elements=["trial_id", "name", "step"],
            set_={"value": statement.excluded.value, "nonfinite": statement.excluded.nonfinite},
        ),
        rows,
    )
