"""What workers report while a trial runs: metric points (idempotent batch upserts, within the
per-trial quota) and checkpoint records, each fenced by the trial's current lease."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Protocol

import msgspec
from sqlalchemy import delete, func, select, text
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from . import objective
from .db import Database
from .errors import Conflict, LeaseLost, NotFound, QuotaExceeded
from .models import Checkpoint, MetricPoint, Study, Trial, TrialStatus
from .schemas import CheckpointIn, MetricsAccepted
from .values import to_storage

_ENCODE = msgspec.json.Encoder().encode


class Point(Protocol):
    """A metric point as the routes decode it (`schemas.MetricPointIn`, or `wire.PointIn`)."""

    @property
    def step(self) -> int: ...
    @property
    def name(self) -> str: ...
    @property
    def value(self) -> float: ...

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
# The whole write in one statement: lock the trial (by its key alone: with its other conditions
# the planner may prefer walking the partial index of running trials) under its lease (and only
# when the whole batch fits in its quota as new points), insert, count the new rows, and when the
# batch carries the objective metric, the best of the stored points that the batch does not
# replace and the batch's own (one snapshot: the statement does not see its insert). No row when
# it wrote nothing.
_PG_WRITE = """
    WITH locked AS (
        SELECT id, study_id, lease_id, status, point_count FROM trials WHERE id = :trial_id FOR UPDATE
    ), trial AS (
        SELECT locked.id, s.objective_metric, s.objective_mode
        FROM locked JOIN studies s ON s.id = locked.study_id
        WHERE locked.lease_id = :lease_id AND locked.status = 'running' AND locked.point_count <= :room
    ), batch AS NOT MATERIALIZED (
        SELECT (CAST(:names AS text[]))[p.name_index] AS name, p.step, p.value, p.nonfinite
        FROM unnest(CAST(:name_indexes AS integer[]), CAST(:steps AS integer[]),
                    CAST(:values AS double precision[]), CAST(:nonfinite AS smallint[]))
             AS p(name_index, step, value, nonfinite)
    ), written AS (
        INSERT INTO metric_points (trial_id, name, step, value, nonfinite)
        SELECT trial.id, batch.name, batch.step, batch.value, batch.nonfinite FROM trial, batch
        {conflict}
    ), best AS (
        SELECT c.value, c.step FROM trial, (
            SELECT m.value, m.step FROM trial JOIN metric_points m
                ON m.trial_id = trial.id AND m.name = trial.objective_metric AND m.nonfinite = 0
            WHERE NOT EXISTS (SELECT 1 FROM batch WHERE batch.name = m.name AND batch.step = m.step)
            UNION ALL
            SELECT batch.value, batch.step FROM trial JOIN batch
                ON batch.name = trial.objective_metric AND batch.nonfinite = 0
        ) AS c
        ORDER BY CASE WHEN trial.objective_mode = 'min' THEN c.value ELSE -c.value END, c.step
        LIMIT 1
    ), objective AS (
        SELECT trial.objective_metric = ANY(CAST(:names AS text[])) AS carried FROM trial
    )
    UPDATE trials SET
        point_count = trials.point_count + {added},
        objective_value = CASE WHEN objective.carried THEN (SELECT value FROM best) ELSE trials.objective_value END,
        best_step = CASE WHEN objective.carried THEN (SELECT step FROM best) ELSE trials.best_step END
    FROM trial, objective
    WHERE trials.id = trial.id
    RETURNING trials.objective_value, trials.best_step
"""
# The common batch, all new points: a plain INSERT, which costs Postgres half the CPU of an
# upsert's speculative insertion (2.2 against 4.6 us a point here), and whose points all count as
# new. A point already stored (a replay) fails it as a whole, writing nothing.
_PG_NEW_POINTS = text(_PG_WRITE.format(conflict="", added="CAST(:batch_size AS integer)"))
# The replay: an upsert, counting the rows it inserted (`xmax = 0`) rather than updated.
_PG_ONE_STATEMENT = text(
    _PG_WRITE.format(
        conflict="ON CONFLICT (trial_id, name, step) DO UPDATE SET value = EXCLUDED.value, "
        "nonfinite = EXCLUDED.nonfinite RETURNING (xmax = 0) AS added",
        added="(SELECT count(*) FROM written WHERE added)",
    )
)


def record_metrics(
    db: Database, trial_id: int, lease_id: str, points: Sequence[Point], max_points: int | None = None
) -> MetricsAccepted:
    """Upserts the points on (trial, name, step): replaying a step overwrites instead of
    duplicating; within one batch the last point for a (name, step) wins. NaN and infinities are
    stored as data. Refreshes the objective when the batch carries the objective metric.
    `QuotaExceeded`, storing nothing of the batch, when the trial would hold more than
    `max_points` points (points it already holds, replayed, do not count again)."""
    latest = {(p.name, p.step): p.value for p in points}
    if not db.is_sqlite and latest and max_points is not None and len(latest) <= max_points:
        done = _record_in_one_statement(db, trial_id, lease_id, latest, max_points)
        if done is not None:
            return done
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


def _record_in_one_statement(
    db: Database, trial_id: int, lease_id: str, latest: dict[tuple[str, int], float], max_points: int
) -> MetricsAccepted | None:
    """The common batch on Postgres as one statement in autocommit (one round trip where the
    transaction took six): lease check and trial lock, upsert, point count and objective. It
    writes only when the trial could hold the whole batch as new points; None when it wrote
    nothing (not found, lease lost, near the quota, a trial from before counting), and then the
    transaction in `record_metrics` decides, with the exact error."""
    params = {**_array_literals(latest), "trial_id": trial_id, "lease_id": lease_id, "room": max_points - len(latest)}
    try:
        with db.statement() as connection:
            row = connection.execute(_PG_NEW_POINTS, {**params, "batch_size": len(latest)}).first()
    except Conflict:  # some point was stored already (a replay): the upsert overwrites it
        with db.statement() as connection:
            row = connection.execute(_PG_ONE_STATEMENT, params).first()
    if row is None:
        return None
    return MetricsAccepted(accepted=len(latest), objective_value=row.objective_value, best_step=row.best_step)


def _array_literals(latest: dict[tuple[str, int], float]) -> dict[str, Any]:
    """The batch as Postgres array literals (`{1,2,3}`): numbers formatted by str() and repr() in
    C loops cost a tenth of the driver adapting each element of a list (which was a third of a
    batch's time). repr() of a float round-trips exactly; non-finite values are NULL with their
    flag. Names, a few per batch, go as a list the driver quotes."""
    names = [name for name, _ in latest]
    index = {name: str(i) for i, name in enumerate(dict.fromkeys(names), 1)}
    values = list(latest.values())
    if all(map(math.isfinite, values)):
        value_text, flags = _json_list(values), ",".join(["0"] * len(values))
    else:
        stored = [to_storage(value) for value in values]
        value_text = ",".join("NULL" if v is None else repr(v) for v, _ in stored)
        flags = ",".join(str(int(flag)) for _, flag in stored)
    return {
        "names": list(index),
        "name_indexes": "{" + ",".join(map(index.__getitem__, names)) + "}",
        "steps": "{" + _json_list([step for _, step in latest]) + "}",
        "values": "{" + value_text + "}",
        "nonfinite": "{" + flags + "}",
    }


def _json_list(numbers: list[float] | list[int]) -> str:
    """`1,2.5,3e-07`: msgspec writes the shortest text that reads back as the same double (as
    repr() does) in C, a tenth of the time of joining repr()s."""
    return _ENCODE(numbers)[1:-1].decode()


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
