"""The version-keyed memo of a study's derived data: kept while nothing changes, recomputed when a
trial is claimed or finishes, one computation for concurrent callers, never kept while a trial
runs when the caller says its value follows every new point."""

from __future__ import annotations

import threading
import time

from hpo.server.cache import memo
from hpo.server.db import Database
from hpo.server.studies import service as studies
from hpo.server.trials import leases
from tests.server.factories import study_spec


def _counting() -> tuple[list[int], object]:
    calls: list[int] = []

    def compute() -> int:
        calls.append(1)
        time.sleep(0.05)
        return len(calls)

    return calls, compute


def test_kept_until_the_study_changes(db: Database) -> None:
    memo.clear()
    study = studies.create_study(db, study_spec())
    calls, compute = _counting()
    assert memo.remember(db, study.id, "x", compute) == 1  # type: ignore[arg-type]
    assert memo.remember(db, study.id, "x", compute) == 1  # type: ignore[arg-type]
    assert memo.peek(db, study.id, "x") == 1 and memo.peek(db, study.id, "other") is None
    claim = leases.claim(db, "w", 4, 0, 60)  # a trial starts: the version moves on
    assert claim is not None
    assert memo.peek(db, study.id, "x") is None
    assert memo.remember(db, study.id, "x", compute) == 2  # type: ignore[arg-type]
    # while a trial runs, a value that follows every point is computed on every call
    assert memo.remember(db, study.id, "y", compute, live=False) == 3  # type: ignore[arg-type]
    assert memo.remember(db, study.id, "y", compute, live=False) == 4  # type: ignore[arg-type]
    leases.complete(db, claim.trial_id, claim.lease_id)
    assert memo.remember(db, study.id, "y", compute, live=False) == 5  # type: ignore[arg-type]
    assert memo.remember(db, study.id, "y", compute, live=False) == 5  # type: ignore[arg-type]
    assert len(calls) == 5


def test_concurrent_callers_share_one_computation(db: Database) -> None:
    memo.clear()
    study = studies.create_study(db, study_spec())
    calls, compute = _counting()
    answers: list[int] = []
    threads = [
        threading.Thread(target=lambda: answers.append(memo.remember(db, study.id, "x", compute)))  # type: ignore[arg-type]
        for _ in range(6)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert answers == [1] * 6 and len(calls) == 1
