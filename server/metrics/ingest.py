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

from hpo.server.db import Database
from hpo.server.errors import LeaseLost, NotFound, QuotaExceeded
from hpo.server.metrics import objective
from hpo.server.models import Checkpoint, MetricPoint, Study, Trial, TrialStatus
from hpo.server.numbers import to_storage
from hpo.server.schemas import CheckpointIn, MetricsAccepted

_ENCODE = msgspec.json.Encoder().encode


class Point(Protocol):
    """A metric point as the routes decode it (`schemas.MetricPointIn`, or `wire.PointIn`)."""

    @property
    def step(self) -> int: ...
    @property
    def name(self) -> str: ...
    @property
    def value(self) -> float: ...


# On Postgres a batch's points of one metric are one `metric_chunks` row (migration 0014): their
# steps ascending and unique, values and non-finite flags as arrays, the steps disjoint from the
# trial's other rows of that metric; `metric_points` is a view that unnests them. A batch travels
# as three flat arrays sorted by metric and step, and per metric its name and the (1-based) first
# and last index of its run, so each chunk is three slices of them: no row per point, no sort and
# no aggregate in Postgres (unnesting and re-aggregating took 2 of a batch's 2.2 us a point).
# The common batch as one statement: lock the trial (by its key alone: with its other conditions
# the planner may prefer walking the partial index of running trials) under its lease, when the
# whole batch fits in its quota as new points and every metric's steps come after the steps stored
# for it (appending: its points are all new), then insert one chunk per metric, count the points
# and, when the batch carries the objective metric, take the better of the trial's kept best (the
# best of its stored points: appending replaces none) and the batch's own (reading every stored
# point of the objective instead cost each batch time in proportion to the trial's history).
# The statement reads chunks in its snapshot, which misses a batch of this trial that committed
# while it waited for the lock: it then writes nothing (the point count it locked is not
# the one it sees), as when the lease is lost or a step is not new, and the transaction in
# `record_metrics` does the write, or says why not.
_PG_APPEND = text(
    """
    WITH locked AS (
        SELECT id, study_id, lease_id, status, point_count, objective_value, best_step
        FROM trials WHERE id = :trial_id FOR UPDATE
    ), arrays AS MATERIALIZED (
        SELECT CAST(:steps AS integer[]) AS steps, CAST(:values AS double precision[]) AS vals,
               CAST(:nonfinite AS smallint[]) AS nonfinite
    ), runs AS MATERIALIZED (
        SELECT r.name, a.steps[r.first:r.last] AS steps, a.vals[r.first:r.last] AS vals,
               a.nonfinite[r.first:r.last] AS nonfinite
        FROM arrays a, unnest(CAST(:names AS text[]), CAST(:firsts AS integer[]), CAST(:lasts AS integer[]))
             AS r(name, first, last)
    ), trial AS (
        SELECT locked.id, s.objective_metric, s.objective_mode
        FROM locked JOIN studies s ON s.id = locked.study_id
        WHERE locked.lease_id = :lease_id AND locked.status = 'running' AND locked.point_count <= :room
          AND locked.point_count = (SELECT seen.point_count FROM trials seen WHERE seen.id = :trial_id)
          AND NOT EXISTS (
              SELECT 1 FROM runs
              WHERE (SELECT c.last_step FROM metric_chunks c WHERE c.trial_id = :trial_id AND c.name = runs.name
                     ORDER BY c.first_step DESC LIMIT 1) >= runs.steps[1])
    ), written AS (
        INSERT INTO metric_chunks (trial_id, name, first_step, last_step, steps, vals, nonfinite)
        SELECT trial.id, runs.name, runs.steps[1], runs.steps[cardinality(runs.steps)], runs.steps, runs.vals,
               runs.nonfinite
        FROM trial, runs
    ), best AS (
        SELECT c.value, c.step FROM trial, (
            SELECT locked.objective_value AS value, locked.best_step AS step FROM locked
            WHERE locked.objective_value IS NOT NULL
            UNION ALL
            SELECT p.value, p.step FROM trial JOIN runs ON runs.name = trial.objective_metric,
                unnest(runs.steps, runs.vals, runs.nonfinite) AS p(step, value, nonfinite)
            WHERE p.nonfinite = 0
        ) AS c
        ORDER BY CASE WHEN trial.objective_mode = 'min' THEN c.value ELSE -c.value END, c.step
        LIMIT 1
    ), objective AS (
        SELECT trial.objective_metric = ANY(CAST(:names AS text[])) AS carried FROM trial
    )
    UPDATE trials SET
        point_count = trials.point_count + CAST(:batch_size AS integer),
        objective_value = CASE WHEN objective.carried THEN (SELECT value FROM best) ELSE trials.objective_value END,
        best_step = CASE WHEN objective.carried THEN (SELECT step FROM best) ELSE trials.best_step END
    FROM trial, objective
    WHERE trials.id = trial.id
    RETURNING trials.objective_value, trials.best_step
"""
)
# Any other batch, in the locked trial's transaction: per metric, the chunks whose steps reach
# into the batch's range are taken out and merged with it (the batch's point wins a step), and
# written back as one chunk; it spans no other chunk, since those lie wholly outside that range.
_TAKE_CHUNKS = text(
    "DELETE FROM metric_chunks WHERE trial_id = :trial_id AND name = :name "
    "AND first_step <= :last AND last_step >= :first RETURNING steps, vals, nonfinite"
)
_PUT_CHUNK = text(
    "INSERT INTO metric_chunks (trial_id, name, first_step, last_step, steps, vals, nonfinite) "
    "VALUES (:trial_id, :name, :first, :last, CAST(:steps AS integer[]), CAST(:values AS double precision[]), "
    "CAST(:nonfinite AS smallint[]))"
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
    transaction took six): lease check and trial lock, one chunk per metric, point count and
    objective. It writes only when the trial could hold the whole batch as new points and every
    metric's steps follow the stored ones; None when it wrote nothing (not found, lease lost, near
    the quota, a trial from before counting, a replay or a batch reaching back, a concurrent batch
    of the trial), and then the transaction in `record_metrics` writes it or gives the exact error."""
    params = {**_array_literals(latest), "trial_id": trial_id, "lease_id": lease_id, "room": max_points - len(latest)}
    with db.statement() as connection:
        row = connection.execute(_PG_APPEND, {**params, "batch_size": len(latest)}).first()
    if row is None:
        return None
    return MetricsAccepted(accepted=len(latest), objective_value=row.objective_value, best_step=row.best_step)


def _array_literals(latest: dict[tuple[str, int], float]) -> dict[str, Any]:
    """The batch as Postgres array literals (`{1,2,3}`), sorted by metric and step, with each
    metric's run (`names`, `firsts`, `lasts`): numbers formatted by str() and repr() in C loops
    cost a tenth of the driver adapting each element of a list (which was a third of a batch's
    time). repr() of a float round-trips exactly; non-finite values are NULL with their flag. Names,
    a few per batch, go as a list the driver quotes."""
    keys = sorted(latest)  # already in order, as reporters send them, this is one linear pass
    names: list[str] = []
    firsts: list[int] = []
    for i, (name, _) in enumerate(keys, 1):
        if not names or names[-1] != name:
            names.append(name)
            firsts.append(i)
    lasts = [first - 1 for first in firsts[1:]] + [len(keys)]
    values = [latest[key] for key in keys]
    if all(map(math.isfinite, values)):
        value_text, flags = _json_list(values), ",".join(["0"] * len(values))
    else:
        stored = [to_storage(value) for value in values]
        value_text = ",".join("NULL" if v is None else repr(v) for v, _ in stored)
        flags = ",".join(str(int(flag)) for _, flag in stored)
    return {
        "names": names,
        "firsts": "{" + _json_list(firsts) + "}",
        "lasts": "{" + _json_list(lasts) + "}",
        "steps": "{" + _json_list([step for _, step in keys]) + "}",
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
        return _merge_chunks(session, trial_id, latest, stored)
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


def _merge_chunks(
    session: Session, trial_id: int, latest: dict[tuple[str, int], float], stored: list[tuple[float | None, int]]
) -> int:
    """Postgres: merges the batch into the trial's chunks, metric by metric (see `_TAKE_CHUNKS`);
    answers how many of its points were new."""
    by_name: dict[str, dict[int, tuple[float | None, int]]] = {}
    for (name, step), (value, flag) in zip(latest, stored, strict=True):
        by_name.setdefault(name, {})[step] = (value, int(flag))
    added = 0
    for name, points in by_name.items():
        span = {"trial_id": trial_id, "name": name, "first": min(points), "last": max(points)}
        merged: dict[int, tuple[float | None, int]] = {}
        for steps, values, flags in session.execute(_TAKE_CHUNKS, span):
            merged.update(zip(steps, zip(values, flags, strict=True), strict=True))
        added += sum(1 for step in points if step not in merged)
        merged.update(points)
        steps = sorted(merged)
        session.execute(
            _PUT_CHUNK,
            {
                **span,
                "first": steps[0],
                "last": steps[-1],
                "steps": steps,
                "values": [merged[step][0] for step in steps],
                "nonfinite": [merged[step][1] for step in steps],
            },
        )
    return added


def _rowcount(result: Any) -> int:
    return int(result.rowcount or 0)
