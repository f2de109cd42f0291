"""The one-statement write paths on Postgres (docs/decisions.md, "Fleet scale") against the
transactional ones they replace, on SQLite and Postgres: a trial's objective, point count and
fencing come out the same whichever path a batch takes (replays that overwrite the best point,
non-finite objectives, a trial from before counting, a batch near the quota), and heartbeats and
claims keep their answers."""

from __future__ import annotations

import math
import random
import threading

import pytest
from sqlalchemy import select, text, update

from hpo.server.analysis import load
from hpo.server.db import Database
from hpo.server.errors import LeaseLost, NotFound, QuotaExceeded
from hpo.server.metrics import ingest
from hpo.server.models import MetricPoint, Study, StudyStatus, Trial
from hpo.server.schemas import MetricPointIn
from hpo.server.studies import service as studies
from hpo.server.trials import leases

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
    first = ingest.record_metrics(
        db, trial_id, lease, _points((10, "valid/error_rate", 0.3), (20, "valid/error_rate", 0.1)), 1000
    )
    assert (first.objective_value, first.best_step) == (0.1, 20)
    # A replay of step 20 with a worse value: the best is now step 10's, not the replaced 0.1.
    replay = ingest.record_metrics(db, trial_id, lease, _points((20, "valid/error_rate", 0.5)), 1000)
    assert (replay.objective_value, replay.best_step) == (0.3, 10)
    # Other metrics leave the objective as it is; ties go to the earliest step.
    other = ingest.record_metrics(db, trial_id, lease, _points((30, "train/loss", 0.01)), 1000)
    assert (other.objective_value, other.best_step) == (0.3, 10)
    tie = ingest.record_metrics(db, trial_id, lease, _points((40, "valid/error_rate", 0.3)), 1000)
    assert (tie.objective_value, tie.best_step) == (0.3, 10)
    # Four distinct points stored, counted once each although step 20 came twice.
    assert _stored(db, trial_id) == (4, 0.3, 10, 4)


def test_non_finite_objective_points_are_data_not_a_best(db: Database) -> None:
    trial_id, lease = _claimed(db)
    answer = ingest.record_metrics(
        db, trial_id, lease, _points((1, "valid/error_rate", math.nan), (2, "valid/error_rate", -math.inf)), 1000
    )
    assert (answer.objective_value, answer.best_step) == (None, None)
    answer = ingest.record_metrics(
        db, trial_id, lease, _points((3, "valid/error_rate", 0.7), (2, "valid/error_rate", 0.9)), 1000
    )
    assert (answer.objective_value, answer.best_step) == (0.7, 3)
    assert _stored(db, trial_id) == (3, 0.7, 3, 3)


def test_uncounted_trials_and_the_quota_take_the_exact_path(db: Database) -> None:
    trial_id, lease = _claimed(db)
    ingest.record_metrics(db, trial_id, lease, _points((1, "train/loss", 1.0), (2, "train/loss", 0.9)), 5)
    with db.transaction() as session:  # a trial from before points were counted
        session.execute(update(Trial).where(Trial.id == trial_id).values(point_count=None))
    ingest.record_metrics(db, trial_id, lease, _points((3, "train/loss", 0.8)), 5)
    assert _stored(db, trial_id)[0] == 3
    # 3 held + 3 sent is over 5 unless the replays are seen as replays: the exact path does.
    ingest.record_metrics(db, trial_id, lease, _points((2, "train/loss", 0.5), (3, "train/loss", 0.4), (4, "x", 1)), 5)
    assert _stored(db, trial_id)[0] == 4
    with pytest.raises(QuotaExceeded):
        ingest.record_metrics(db, trial_id, lease, _points((5, "x", 1), (6, "x", 1)), 5)
    assert _stored(db, trial_id)[0] == 4


def test_fencing_holds_on_the_fast_paths(db: Database) -> None:
    trial_id, lease = _claimed(db)
    with pytest.raises(LeaseLost):
        ingest.record_metrics(db, trial_id, "0" * 36, _points((1, "train/loss", 1.0)), 1000)
    with pytest.raises(NotFound):
        ingest.record_metrics(db, 999_999, lease, _points((1, "train/loss", 1.0)), 1000)
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
        ingest.record_metrics(db, trial_id, lease, _points((1, "train/loss", 1.0)), 1000)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_any_sequence_of_batches_and_cuts_stores_the_last_value_of_each_step(db: Database, seed: int) -> None:
    """Appends, replays, batches reaching back between or across stored ones, several metrics, and
    history cuts inside a batch: the stored points are exactly the last value sent for each
    (metric, step) not cut, counted once each; on Postgres the chunks of a metric stay ascending
    and disjoint (migration 0014)."""
    rng = random.Random(seed)
    trial_id, lease = _claimed(db)
    expected: dict[tuple[str, int], float] = {}
    top = 0
    for _ in range(40):
        kind = rng.random()
        if kind < 0.1 and expected:  # a resumed attempt's history cut
            after = rng.randrange(0, top + 1)
            with db.transaction() as session:
                deleted = leases._delete_points(session, trial_id, after)
            gone = [key for key in expected if key[1] > after]
            assert deleted == len(gone)
            for key in gone:
                del expected[key]
            with db.transaction() as session:
                session.get_one(Trial, trial_id).point_count = len(expected)
            continue
        if kind < 0.6:  # appending
            steps = range(top + 1, top + 1 + rng.randrange(1, 30))
        else:  # anywhere so far: replays, gaps filled, ranges spanning stored batches
            lo = rng.randrange(0, top + 1)
            steps = range(lo, lo + rng.randrange(1, 40))
        points = [
            (step, name, round(rng.uniform(0, 1), 6))
            for step in steps
            for name in rng.sample(["valid/error_rate", "train/loss", "train/grad_norm"], rng.randrange(1, 4))
            if rng.random() < 0.8
        ]
        if not points:
            continue
        ingest.record_metrics(db, trial_id, lease, _points(*points), 100_000)
        expected.update({(name, step): value for step, name, value in points})
        top = max(top, *(step for step, _, _ in points))
    with db.transaction() as session:
        rows = session.scalars(select(MetricPoint).where(MetricPoint.trial_id == trial_id))
        stored = {(p.name, p.step): p.value for p in rows}
        count = session.get_one(Trial, trial_id).point_count
        if not db.is_sqlite:
            chunks = session.execute(
                text(
                    "SELECT name, first_step, last_step, steps FROM metric_chunks "
                    "WHERE trial_id = :t ORDER BY name, first_step"
                ),
                {"t": trial_id},
            ).all()
            for a, b in zip(chunks, chunks[1:], strict=False):
                assert a.name != b.name or a.last_step < b.first_step
            for chunk in chunks:
                assert list(chunk.steps) == sorted(set(chunk.steps))
                assert (chunk.first_step, chunk.last_step) == (chunk.steps[0], chunk.steps[-1])
        study_id = session.get_one(Trial, trial_id).study_id
        # The horizon of a spec without max_train_steps (read from the chunks on Postgres).
        last_steps = {name: load.last_step(session, study_id, name) for name in {n for n, _ in expected}}
    assert stored == expected
    assert count == len(expected)
    assert last_steps == {name: max(s for n, s in expected if n == name) for name in last_steps}


@pytest.mark.postgres
def test_batches_sent_twice_at_once_store_each_point_once(postgres_url: str) -> None:
    """A reporter's retry can arrive while its first try is still being written: the one-statement
    path then sees the trial's chunks as they were before the lock it waited for, and must leave
    the batch to the transaction, which merges it (no error, no step stored twice)."""
    db = Database(postgres_url)
    db.upgrade()
    trial_id, lease = _claimed(db)
    batches = [_points(*((step, "train/loss", step / 7) for step in range(b * 50, b * 50 + 50))) for b in range(20)]
    errors: list[BaseException] = []

    def send() -> None:
        try:
            for batch in batches:
                ingest.record_metrics(db, trial_id, lease, batch, 100_000)
        except BaseException as exc:  # collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=send) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    with db.transaction() as session:
        steps = (
            session.execute(text("SELECT step FROM metric_points WHERE trial_id = :t ORDER BY step"), {"t": trial_id})
            .scalars()
            .all()
        )
        assert session.get_one(Trial, trial_id).point_count == 1000
    assert steps == list(range(1000))
    db.dispose()
