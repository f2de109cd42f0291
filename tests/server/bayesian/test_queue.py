"""The proposal queue on SQLite and Postgres: initial Halton trials, proposals typed and in range
for every arm (conditional names only where their `when` holds), records of what each proposal
saw, the budget, and one fitter per study however many refillers try."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from sqlalchemy import select, update

from hpo.server.bayesian import queue
from hpo.server.bayesian.designer import Problem, Proposal, propose
from hpo.server.db import Database
from hpo.server.models import BayesianProposal, BayesianState, Trial
from hpo.server.spec.parse import parse_spec
from hpo.server.studies import service as studies
from hpo.server.trials import leases
from tests.server.bayesian.helpers import bayesian_spec, run_one

MIXED = {
    "name": "mixed",
    "algorithm": "bayesian",
    "num_trials": 5,
    "seed": 3,
    "objective": {"metric": "valid/loss", "mode": "min"},
    "bayesian": {"initial_trials": 2, "queue_size": 4},
    "hyperparameters": [
        {"name": "optimizer", "role": "scientific", "type": "categorical", "values": ["sgd", "adam"]},
        {"name": "learning_rate", "role": "nuisance", "type": "float", "min": 1e-4, "max": 1.0, "scale": "log"},
        {"name": "momentum", "role": "nuisance", "type": "float", "min": 0.5, "max": 0.99, "scale": "reverse_log",
         "when": {"optimizer": ["sgd"]}},
        {"name": "beta1", "role": "nuisance", "type": "float", "min": 0.5, "max": 0.99, "scale": "reverse_log",
         "when": {"optimizer": ["adam"]}},
        {"name": "warmup_steps", "role": "nuisance", "type": "int", "min": 0, "max": 100},
        {"name": "activation", "role": "nuisance", "type": "categorical", "values": ["relu", "gelu", "tanh"]},
        {"name": "batch_size", "role": "fixed", "value": 128},
    ],
}  # fmt: skip


def _mixed_objective(params: dict[str, Any]) -> float:
    return abs(params["learning_rate"] - 0.01) + params["warmup_steps"] / 1000 + (params["activation"] == "tanh")


def _check_params(params: dict[str, Any]) -> None:
    assert params["optimizer"] in ("sgd", "adam")
    conditional = "momentum" if params["optimizer"] == "sgd" else "beta1"
    assert set(params) == {"optimizer", "learning_rate", conditional, "warmup_steps", "activation", "batch_size"}
    assert isinstance(params["learning_rate"], float) and 1e-4 <= params["learning_rate"] <= 1.0
    assert isinstance(params[conditional], float) and 0.5 <= params[conditional] <= 0.99
    assert type(params["warmup_steps"]) is int and 0 <= params["warmup_steps"] <= 100
    assert params["activation"] in ("relu", "gelu", "tanh")
    assert params["batch_size"] == 128


def _trials(db: Database, study_id: int) -> list[Trial]:
    with db.transaction() as session:
        return list(session.scalars(select(Trial).where(Trial.study_id == study_id).order_by(Trial.number)))


def test_queue_proposes_typed_points_per_arm_and_records_what_it_saw(db: Database) -> None:
    study = studies.create_study(db, MIXED)
    assert study.trial_counts.pending == 4  # 2 Halton points x 2 arms
    for _ in range(4):
        assert run_one(db, _mixed_objective) is not None
    assert run_one(db, _mixed_objective) is None  # the queue is empty: the claim answers nothing

    assert queue.refill_once(db, "a") == 4  # queue_size 4, two per arm
    assert queue.refill_once(db, "a") == 0  # full
    proposed = [t for t in _trials(db, study.id) if t.number >= 4]
    assert sorted(t.arm["optimizer"] for t in proposed) == ["adam", "adam", "sgd", "sgd"]
    for trial in proposed:
        _check_params(trial.params)
    with db.transaction() as session:
        records = {r.trial_id: r for r in session.scalars(select(BayesianProposal))}
    finished = {t.id: t for t in _trials(db, study.id) if t.number < 4}
    for trial in proposed:
        record = records[trial.id]
        assert record.model == "gp"
        assert {finished[i].arm["optimizer"] for i in record.observed_trial_ids} == {trial.arm["optimizer"]}
        assert len(record.observed_trial_ids) == 2 and record.pending_trial_ids == []

    # Two of them run; the next proposals count them as pending and never repeat a pending point.
    claimed = [leases.claim(db, "w", 4, 0, 60) for _ in range(2)]
    assert queue.refill_once(db, "a") == 2
    newest = [t for t in _trials(db, study.id) if t.number >= 8]
    assert len(newest) == 2
    with db.transaction() as session:
        for trial in newest:
            record = session.get_one(BayesianProposal, trial.id)
            same_arm = [t for t in proposed if t.arm == trial.arm]
            assert set(record.pending_trial_ids) == {t.id for t in same_arm}
            assert all(t.params != trial.params for t in same_arm)
    assert {c.trial_id for c in claimed if c} <= {t.id for t in proposed}


def test_budget_is_num_trials_per_arm_and_the_study_completes_after_it(db: Database) -> None:
    study = studies.create_study(db, bayesian_spec(num_trials=4, initial_trials=3, queue_size=3))
    while True:
        if run_one(db) is None and queue.refill_once(db, "a") == 0:
            break
    assert len(_trials(db, study.id)) == 4
    assert studies.get_study(db, study.id).status == "completed"


def _counting(calls: list[int], pause: float = 0.0) -> Any:
    def run(problem: Problem) -> Proposal:
        calls.append(problem.q)
        time.sleep(pause)
        return propose(problem)

    return run


def test_two_refillers_never_fit_the_same_study_at_once(db: Database) -> None:
    study = studies.create_study(db, bayesian_spec(num_trials=10, initial_trials=2, queue_size=2))
    for _ in range(2):
        run_one(db)
    calls: list[int] = []
    barrier = threading.Barrier(2)
    made: list[int] = []

    def refiller(owner: str) -> None:
        barrier.wait()
        made.append(queue.refill_study(db, study.id, owner, _counting(calls, pause=0.5)))

    threads = [threading.Thread(target=refiller, args=(name,)) for name in ("a", "b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert calls == [2]  # one fit, by whichever took the lease
    assert sorted(made) == [0, 2]
    assert len(_trials(db, study.id)) == 4


def test_a_lease_held_elsewhere_blocks_and_a_lapsed_one_does_not(db: Database) -> None:
    study = studies.create_study(db, bayesian_spec(num_trials=10, initial_trials=1, queue_size=1))
    run_one(db)
    assert queue.acquire(db, study.id, "crashed")
    calls: list[int] = []
    assert queue.refill_study(db, study.id, "b", _counting(calls)) == 0 and calls == []
    with db.transaction() as session:  # the crashed server's lease lapses
        session.execute(update(BayesianState).values(lease_until=db.now_seconds() - 1))
    assert queue.refill_study(db, study.id, "b", _counting(calls)) == 1 and calls == [1]


def test_proposals_made_under_a_lost_lease_are_dropped(db: Database) -> None:
    study = studies.create_study(db, bayesian_spec(num_trials=10, initial_trials=1, queue_size=1))
    run_one(db)

    def stolen(problem: Problem) -> Proposal:
        # While this process fits, its lease lapses and another server takes the study.
        queue.release(db, study.id, "a")
        assert queue.acquire(db, study.id, "thief")
        return propose(problem)

    assert queue.refill_study(db, study.id, "a", stolen) == 0
    assert len(_trials(db, study.id)) == 1


@pytest.mark.parametrize("objective_mode", ["min"])
def test_bayesian_beats_random_search_on_a_smooth_planted_function(database_url: str, objective_mode: str) -> None:
    if not database_url.startswith("sqlite"):
        pytest.skip("quality does not depend on the database: SQLite only, to keep the suite fast")
    db = Database(database_url)
    db.upgrade()
    wins = 0
    for seed in range(3):
        best = {}
        for algorithm in ("bayesian", "random"):
            spec = {**bayesian_spec(name=f"{algorithm}-{seed}", num_trials=14), "seed": seed, "algorithm": algorithm}
            if algorithm == "bayesian":
                spec["bayesian"] = {"initial_trials": 5, "queue_size": 1}
            study = studies.create_study(db, spec)
            while True:
                if run_one(db) is None and queue.refill_once(db, "a") == 0:
                    break
            best[algorithm] = studies.get_study(db, study.id).best_value
        wins += best["bayesian"] < best["random"]
    db.dispose()
    assert wins >= 2, best


def test_spec_validation_for_bayesian() -> None:
    spec = parse_spec(MIXED)
    assert spec.bayesian is not None and spec.bayesian.queue_size == 4
