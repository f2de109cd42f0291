"""The one-statement write paths on Postgres (issue 22) against the transactional ones they replace,
on SQLite and Postgres: a trial's objective, point count and fencing come out the same whichever
path a batch takes (replays that overwrite the best point, non-finite objectives, a trial from
before counting, a batch near the quota), and heartbeats and claims keep their answers."""

from __future__ import annotations

import math

import pytest
from sqlalchemy import select, update

from hpo.server import leases, results, studies
from hpo.server.db import Database
from hpo.server.errors import LeaseLost, NotFound, QuotaExceeded
from hpo.server.models import MetricPoint, Study, StudyStatus, Trial
from hpo.server.schemas import MetricPointIn

SPEC = {
    "name": "ingest",
    "num_trials": 2,
    "objective": {"metric": "valid/error_rate", "mode": "min"},
    "hyperparameters": [{"name": "learning_rate", "role": "nuisance", "type": "float", "min": 0.01, "max": 1.0}],
}


def _claimed(db: Database) -> tuple[int, str]:
    studies.create_study(db, SPEC)
    claim = leases.claim(db, "w", 8, 0, 60)
    assert claim is not None
    return claim.trial_id, claim.lease_id


def _points(*triples: tuple[int, str, float]) -> list[MetricPointIn]:
    return [MetricPointIn(step=step, name=name, value=value) for step, name, value in triples]


def _stored(db: Database, trial_id: int) -> tuple[int | None, float | None, int | None, int]:
    with db.transaction() as session:
        trial = session.get_one(Trial, trial_id)
        count = len(session.scalars(select(MetricPoint.step).where(MetricPoint.trial_id == trial_id)).all())
        return trial.point_count, trial.objective_value, trial.best_step, count


def test_objective_follows_replays_that_overwrite_the_best(db: Database) -> None:
    trial_id, lease = _claimed(db)
    first = results.record_metrics(
        db, trial_id, lease, _points((10, "valid/error_rate", 0.3), (20, "valid/error_rate", 0.1)), 1000
    )
    assert (first.objective_value, first.best_step) == (0.1, 20)
    # A replay of step 20 with a worse value: the best is now step 10's, not the replaced 0.1.
    replay = results.record_metrics(db, trial_id, lease, _points((20, "valid/error_rate", 0.5)), 1000)
    assert (replay.objective_value, replay.best_step) == (0.3, 10)
    # Other metrics leave the objective as it is; ties go to the earliest step.
    other = results.record_metrics(db, trial_id, lease, _points((30, "train/loss", 0.01)), 1000)
    assert (other.objective_value, other.best_step) == (0.3, 10)
    tie = results.record_metrics(db, trial_id, lease, _points((40, "valid/error_rate", 0.3)), 1000)
    assert (tie.objective_value, tie.best_step) == (0.3, 10)
    # Four distinct points stored, counted once each although step 20 came twice.
    assert _stored(db, trial_id) == (4, 0.3, 10, 4)


def test_non_finite_objective_points_are_data_not_a_best(db: Database) -> None:
    trial_id, lease = _claimed(db)
    answer = results.record_metrics(
        db, trial_id, lease, _points((1, "valid/error_rate", math.nan), (2, "valid/error_rate", -math.inf)), 1000
    )
    assert (answer.objective_value, answer.best_step) == (None, None)
    answer = results.record_metrics(
        db, trial_id, lease, _points((3, "valid/error_rate", 0.7), (2, "valid/error_rate", 0.9)), 1000
    )
    assert (answer.objective_value, answer.best_step) == (0.7, 3)
    assert _stored(db, trial_id) == (3, 0.7, 3, 3)


def test_uncounted_trials_and_the_quota_take_the_exact_path(db: Database) -> None:
    trial_id, lease = _claimed(db)
    results.record_metrics(db, trial_id, lease, _points((1, "train/loss", 1.0), (2, "train/loss", 0.9)), 5)
    with db.transaction() as session:  # a trial from before points were counted
        session.execute(update(Trial).where(Trial.id == trial_id).values(point_count=None))
    results.record_metrics(db, trial_id, lease, _points((3, "train/loss", 0.8)), 5)
    assert _stored(db, trial_id)[0] == 3
    # 3 held + 3 sent is over 5 unless the replays are seen as replays: the exact path does.
    results.record_metrics(db, trial_id, lease, _points((2, "train/loss", 0.5), (3, "train/loss", 0.4), (4, "x", 1)), 5)
    assert _stored(db, trial_id)[0] == 4
    with pytest.raises(QuotaExceeded):
        results.record_metrics(db, trial_id, lease, _points((5, "x", 1), (6, "x", 1)), 5)
    assert _stored(db, trial_id)[0] == 4


def test_fencing_holds_on_the_fast_paths(db: Database) -> None:
    trial_id, lease = _claimed(db)
    with pytest.raises(LeaseLost):
        results.record_metrics(db, trial_id, "0" * 36, _points((1, "train/loss", 1.0)), 1000)
    with pytest.raises(NotFound):
        results.record_metrics(db, 999_999, lease, _points((1, "train/loss", 1.0)), 1000)
    with pytest.raises(LeaseLost):
        leases.heartbeat(db, trial_id, "0" * 36, 60)
    with pytest.raises(NotFound):
        leases.heartbeat(db, 999_999, lease, 60)
    assert _stored(db, trial_id)[3] == 0
    beat = leases.heartbeat(db, trial_id, lease, 60)
    assert not beat.should_stop
    with db.transaction() as session:
        study_id = session.get_one(Trial, trial_id).study_id
        session.execute(update(Study).where(Study.id == study_id).values(status=StudyStatus.paused))
    assert leases.heartbeat(db, trial_id, lease, 60).should_stop
    leases.cancel(db, trial_id)
    assert leases.heartbeat(db, trial_id, lease, 60).should_stop  # cancelled: stop, not 409
    with pytest.raises(LeaseLost):  # but a cancelled trial takes no more points
        results.record_metrics(db, trial_id, lease, _points((1, "train/loss", 1.0)), 1000)
