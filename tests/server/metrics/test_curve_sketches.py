"""Kept curve sketches (`analysis.sketches`): the curves chart reads a completed trial's kept
downsampled curve instead of its points, gets the very answer the points give, and aggregates the
points again whenever the kept row no longer holds (another width, a new attempt, a running trial)."""

from __future__ import annotations

import math

from sqlalchemy import text

from hpo.server.analysis import keeper, load
from hpo.server.analysis.rules.divergence import curve_names, train_loss_name
from hpo.server.cache import memo
from hpo.server.dashboard.charts import service
from hpo.server.db import Database
from hpo.server.metrics import sketches
from hpo.server.schemas import MetricPointIn
from hpo.server.studies import service as studies
from tests.server.analysis import planted
from tests.server.factories import study_spec


def _run_one(db: Database, seed: int, *, complete: bool = True) -> int:
    # a bucket of only a non-finite value (evaluations are 100 steps apart, buckets 34 wide)
    lone = MetricPointIn(step=int(planted.EVAL_STEPS[3]) + 50, name="valid/error_rate", value=math.inf)
    return planted.run_clean_trial(db, seed, complete=complete, extra=[lone])


def _study(db: Database, completed: int, running: int = 0) -> tuple[int, list[int]]:
    study = studies.create_study(db, study_spec(num_trials=completed + running))
    ids = [_run_one(db, seed) for seed in range(completed)]
    ids += [_run_one(db, 100 + seed, complete=False) for seed in range(running)]
    return study.id, ids


def _width(db: Database, study_id: int, points: int = sketches.POINTS) -> int:
    with db.transaction() as session:
        return sketches.bucket_width(load.horizon(session, load.study_info(session, study_id)), points)


def _curves(db: Database, ids: list[int], name: str, width: int) -> dict[int, sketches.Curve]:
    with db.transaction() as session:
        return sketches.curves(session, ids, name, width)


def _from_points(db: Database, ids: list[int], name: str, width: int) -> dict[int, sketches.Curve]:
    with db.transaction() as session:
        return sketches.downsampled(session, ids, name, width)


def _same(a: dict[int, sketches.Curve], b: dict[int, sketches.Curve]) -> bool:
    def close(x: float | None, y: float | None) -> bool:
        return x is None and y is None or (x is not None and y is not None and math.isclose(x, y, rel_tol=1e-12))

    return a.keys() == b.keys() and all(
        a[t][0] == b[t][0] and all(close(x, y) for x, y in zip(a[t][1], b[t][1], strict=True)) for t in a
    )


def test_downsampled_is_each_buckets_first_step_and_mean_of_the_points(db: Database) -> None:
    """Against the points read one by one (on Postgres the buckets come back as a row of arrays per
    trial): a bucket's first step and the mean of its finite values, None when it has none."""
    _, ids = _study(db, completed=2, running=1)
    with db.engine.connect() as conn:
        rows = conn.execute(text("SELECT trial_id, name, step, value FROM metric_points ORDER BY step")).all()
    for name in ("valid/error_rate", "train/loss"):
        for width in (1, 7, 34, 10_000):
            buckets: dict[int, dict[int, list[tuple[int, float | None]]]] = {}
            for r in rows:
                if r.name == name:
                    buckets.setdefault(r.trial_id, {}).setdefault(r.step // width, []).append((r.step, r.value))
            expected: dict[int, sketches.Curve] = {}
            for trial_id, by_bucket in buckets.items():
                steps, means = expected.setdefault(trial_id, ([], []))
                for points in by_bucket.values():
                    finite = [v for _, v in points if v is not None]
                    steps.append(min(step for step, _ in points))
                    means.append(sum(finite) / len(finite) if finite else None)
            assert set(expected) == set(ids)
            assert _same(_from_points(db, ids, name, width), expected)


def test_the_keeper_keeps_every_curve_name_of_completed_trials_only(db: Database) -> None:
    study_id, ids = _study(db, completed=3, running=1)
    assert keeper.keep_all(db) == 3
    with db.transaction() as session:
        info = load.study_info(session, study_id)
        names = curve_names(info.metric, train_loss_name(info))
    with db.engine.begin() as conn:
        rows = conn.execute(text("SELECT trial_id, name, width FROM curve_sketches")).all()
    width = _width(db, study_id)
    assert sorted((r.trial_id, r.name) for r in rows) == sorted((t, n) for t in ids[:3] for n in names)
    assert {r.width for r in rows} == {width}
    assert keeper.studies_to_keep(db) == [] and keeper.keep_all(db) == 0  # nothing left to keep


def test_kept_sketches_answer_what_the_points_answer_and_are_read_back(db: Database) -> None:
    study_id, ids = _study(db, completed=3, running=1)
    width = _width(db, study_id)
    for name in ("valid/error_rate", "train/loss"):
        before = _from_points(db, ids, name, width)
        keeper.keep_all(db)
        assert _same(_curves(db, ids, name, width), before)
    unkept = _from_points(db, ids, "valid/error_rate", width)
    assert any(v is None for v in unkept[ids[0]][1])  # the bucket of only non-finite values
    kept = _curves(db, ids, "valid/error_rate", width)
    assert kept[ids[0]][1] == unkept[ids[0]][1] and kept[ids[0]][0] == unkept[ids[0]][0]

    # What is kept is what the chart reads: a planted mean shows it.
    planted_means = sketches._packed([0], [42.0])
    with db.engine.begin() as conn:
        conn.execute(
            text("UPDATE curve_sketches SET steps = :s, means = :m WHERE trial_id = :t AND name = 'valid/error_rate'"),
            {"s": planted_means[0], "m": planted_means[1], "t": ids[1]},
        )
    assert _curves(db, ids, "valid/error_rate", width)[ids[1]] == ([0], [42.0])
    # Another width, or a new attempt of the trial: the kept row no longer holds.
    other = _width(db, study_id, points=25)
    assert other != width
    assert _same(_curves(db, ids, "valid/error_rate", other), _from_points(db, ids, "valid/error_rate", other))
    with db.engine.begin() as conn:
        conn.execute(text("UPDATE trials SET attempt = attempt + 1 WHERE id = :t"), {"t": ids[1]})
    assert _same(_curves(db, ids, "valid/error_rate", width), unkept)
    # ... and the keeper keeps it again for that attempt.
    assert keeper.studies_to_keep(db) == [study_id] and keeper.keep_all(db) == 1
    assert _curves(db, ids, "valid/error_rate", width)[ids[1]] == unkept[ids[1]]


def test_the_curves_chart_is_the_same_from_kept_sketches(db: Database) -> None:
    study_id, ids = _study(db, completed=4, running=1)
    from_points = service.chart(db, study_id, "curves")
    assert len(from_points["curves"]) == 5
    keeper.keep_all(db)
    memo.clear()
    with db.engine.begin() as conn:  # every completed trial's curve is kept
        assert conn.execute(text("SELECT count(DISTINCT trial_id) FROM curve_sketches")).scalar() == 4
    from_kept = service.chart(db, study_id, "curves")
    assert from_kept["width"] == from_points["width"]
    by_id = {c["id"]: c for c in from_points["curves"]}
    assert [c["id"] for c in from_kept["curves"]] == [c["id"] for c in from_points["curves"]]
    for curve in from_kept["curves"]:
        assert curve["steps"] == by_id[curve["id"]]["steps"]
        expected = by_id[curve["id"]]["values"]
        assert all(
            (a is None and b is None) or math.isclose(a, b, rel_tol=1e-12)
            for a, b in zip(curve["values"], expected, strict=True)
        )
    assert from_kept["y_range"] == from_points["y_range"] or all(
        math.isclose(a, b, rel_tol=1e-9) for a, b in zip(from_kept["y_range"], from_points["y_range"], strict=True)
    )
