"""The kept curve statistics of completed trials: the same numbers as aggregating the points, read
back instead of recomputed, and recomputed when what they were computed with no longer holds."""

from __future__ import annotations

import numpy as np
from sqlalchemy import text

from hpo.server.analysis import load
from hpo.server.db import Database
from hpo.server.studies import service as studies
from tests.server.analysis import planted
from tests.server.factories import study_spec

NAMES = ["train/loss", "valid/error_rate"]


def _complete_one(db: Database, seed: int) -> None:
    planted.run_clean_trial(db, seed)


def _study_with_completed_trials(db: Database, count: int) -> int:
    study = studies.create_study(db, study_spec(num_trials=count))
    for seed in range(count):
        _complete_one(db, seed)
    return study.id


def _stats(db: Database, study_id: int) -> dict[str, load.CurveStats]:
    with db.transaction() as session:
        return load.curve_stats(session, study_id, NAMES, planted.HORIZON, "train/loss")


def _same(a: load.CurveStats, b: load.CurveStats) -> bool:
    order_a, order_b = np.argsort(a.trial_ids), np.argsort(b.trial_ids)
    fields = ("trial_ids", "n", "first", "minimum", "maximum", "end", "late_n", "late_noise", "late_change")
    return all(np.allclose(getattr(a, f)[order_a], getattr(b, f)[order_b], equal_nan=True, rtol=1e-12) for f in fields)


def test_kept_statistics_are_read_back_and_recomputed_when_stale(db: Database) -> None:
    study_id = _study_with_completed_trials(db, 4)
    computed = _stats(db, study_id)
    assert len(computed["valid/error_rate"].trial_ids) == 4
    with db.engine.begin() as conn:
        assert conn.execute(text("SELECT count(*) FROM curve_stats")).scalar() == 8  # 4 trials x 2 names
        # a kept row is what the next call reads: plant a value the points cannot give
        first = int(computed["valid/error_rate"].trial_ids[0])
        conn.execute(text("UPDATE curve_stats SET vmax = 99 WHERE trial_id = :t AND name = 'valid/error_rate'"),
                     {"t": first})  # fmt: skip
    read_back = _stats(db, study_id)
    assert 99.0 in read_back["valid/error_rate"].maximum.tolist()
    with db.engine.begin() as conn:  # the trial ran again: its kept row no longer holds
        conn.execute(text("UPDATE trials SET attempt = attempt + 1 WHERE id = :t"), {"t": first})
    again = _stats(db, study_id)
    assert 99.0 not in again["valid/error_rate"].maximum.tolist()
    for name in NAMES:
        assert _same(again[name], computed[name])
    with db.engine.begin() as conn:  # with nothing kept, the points give the same numbers
        conn.execute(text("DELETE FROM curve_stats"))
    fresh = _stats(db, study_id)
    for name in NAMES:
        assert _same(fresh[name], computed[name])
    # a trial completed later is added to what is kept; the others are read back, not recomputed
    with db.engine.begin() as conn:
        conn.execute(text("UPDATE curve_stats SET vmax = 77 WHERE trial_id = :t AND name = 'valid/error_rate'"),
                     {"t": first})  # fmt: skip
    _complete_one(db, 9)
    more = _stats(db, study_id)
    assert len(more["valid/error_rate"].trial_ids) == 5 and 77.0 in more["valid/error_rate"].maximum.tolist()
    with db.engine.begin() as conn:
        assert conn.execute(text("SELECT count(*) FROM curve_stats")).scalar() == 10


def test_the_keeper_keeps_what_the_analysis_reads(db: Database) -> None:
    """The background keeper (analysis.keeper) aggregates completed trials with the names and
    horizon the analysis asks for: the analysis then reads its rows back (a planted value shows it)
    and computes nothing; a study with nothing left to keep is not listed again."""
    from hpo.server.analysis import keeper
    from hpo.server.analysis.judged import load_trials
    from hpo.server.analysis.rules.divergence import curve_names, train_loss_name

    study_id = _study_with_completed_trials(db, 4)
    assert keeper.studies_to_keep(db) == [study_id]
    assert keeper.keep_all(db) == 4
    assert keeper.studies_to_keep(db) == [] and keeper.keep_all(db) == 0
    with db.transaction() as session:
        info = load.study_info(session, study_id)
        names = curve_names(info.metric, train_loss_name(info))
    with db.engine.begin() as conn:
        assert conn.execute(text("SELECT count(*) FROM curve_stats")).scalar() == 4 * len(names)
        kept = {r[0]: r[1] for r in conn.execute(text("SELECT name, count(*) FROM curve_stats GROUP BY name"))}
        assert kept == dict.fromkeys(names, 4)
        conn.execute(text("UPDATE curve_stats SET vmin = -5 WHERE name = :m"), {"m": info.metric})
    with db.transaction() as session:
        _, stats = load_trials(session, info)
    assert stats[info.metric].minimum.tolist() == [-5.0] * 4  # read back, not aggregated again
    _complete_one(db, 7)
    assert keeper.studies_to_keep(db) == [study_id] and keeper.keep_all(db) == 1
