"""Replicas that cannot differ (docs/analysis.md, "Noise: replicas, arm comparison, trial
variance"). A script that never reads the trial's seed returns bit-identical replicas; the analysis
and the rounds' evidence must then answer `unknown` with a `seed_ignored` warning, never a verdict
from a Welch test on zero variance. Planted through the worker protocol on SQLite and Postgres."""

from __future__ import annotations

from typing import Any

import httpx
import numpy as np

from tests.server.analysis import planted
from tests.server.analysis.protocol import API, Outcome, analysis, create, kinds, run_pending
from tests.server.analysis.test_planted import spec, unit_lr
from tests.server.rounds.test_rounds_api import lr_sweep, make_pipeline, make_round

ARMS = [{"name": "optimizer", "role": "scientific", "type": "categorical", "values": ["sgd", "adam"]}]


def plant(*, use_seed: bool) -> Any:
    """Two arms 0.05 apart; with `use_seed` every run adds seed noise of 0.01, without it the
    script seeds itself with a constant, as the issue's language-model script did."""

    def run(config: dict[str, Any]) -> Outcome:
        seed = config["seed"] if use_seed else 1234
        noise = 0.01 * np.random.default_rng(seed).normal()
        offset = 0.05 if config["params"]["optimizer"] == "sgd" else 0.0
        level = 0.1 + 0.3 * (unit_lr(config) - 0.5) ** 2 + offset + noise
        valid, train = planted.clean(seed, level, noise=0.0005)
        return Outcome({"valid/error_rate": valid, "train/loss": train})

    return run


def replicate(client: httpx.Client, study_id: int, count: int, run: Any) -> dict[str, Any]:
    before = analysis(client, study_id)
    for arm in before["arms"]:
        reply = client.post(f"{API}/trials/{arm['best_trial_id']}/replicas", json={"count": count})
        assert reply.status_code == 201, reply.text
    assert run_pending(client, run) == count * len(before["arms"])
    return analysis(client, study_id)


def test_identical_replicas_give_no_verdict_and_say_the_seed_is_ignored(client: httpx.Client) -> None:
    run = plant(use_seed=False)
    study = create(client, spec("seedless", num_trials=8, scientific=ARMS))
    run_pending(client, run)
    after = replicate(client, study["id"], 3, run)
    cmp = after["comparison"]
    assert cmp["verdict"] == "unknown" and cmp["p_value"] is None and cmp["ci"] is None and cmp["method"] is None
    assert sorted(cmp["seed_ignored_arms"]) == ["optimizer=adam", "optimizer=sgd"]
    assert [k for k in kinds(after) if k != "too_few_trials"] == ["seed_ignored", "seed_ignored"]
    for arm in after["arms"]:
        assert arm["seed_ignored"] is True and arm["replica_std"] is None and arm["replica_ci"] is None
    message = next(w["message"] for w in after["warnings"] if w["kind"] == "seed_ignored")
    assert "4 runs" in message and 'config["seed"]' in message and "{seed}" in message
    assert after["trial_variance"]["measured"] is False


def test_one_identical_replica_is_caught_before_more_are_run(client: httpx.Client) -> None:
    """One replica equal to its original: two runs with different seeds, identical, already tell."""
    run = plant(use_seed=False)
    study = create(client, spec("seedless-one", num_trials=6, scientific=ARMS))
    run_pending(client, run)
    after = replicate(client, study["id"], 1, run)
    assert kinds(after).count("seed_ignored") == 2 and "replicas_recommended" not in kinds(after)
    assert after["comparison"]["verdict"] == "unknown"


def test_replicas_that_use_the_seed_get_a_verdict(client: httpx.Client) -> None:
    run = plant(use_seed=True)
    study = create(client, spec("seeded", num_trials=8, scientific=ARMS))
    run_pending(client, run)
    after = replicate(client, study["id"], 3, run)
    assert after["comparison"]["verdict"] == "different" and after["comparison"]["seed_ignored_arms"] == []
    assert "seed_ignored" not in kinds(after)
    assert all(a["seed_ignored"] is False and a["replica_std"] > 0 for a in after["arms"])


def test_rounds_evidence_uses_the_same_rule(client: httpx.Client) -> None:
    def seedless(config: dict[str, Any]) -> Outcome:
        level = planted.response(np.log10(config["params"]["learning_rate"]), -2.0)
        valid, train = planted.clean(7, level=level, noise=0.0005)
        return Outcome({"valid/error_rate": valid, "train/loss": train})

    pipeline = make_pipeline(client)
    rnd = make_round(client, pipeline["id"])
    client.post(f"{API}/studies", json=lr_sweep(rnd["id"]))
    run_pending(client, seedless)
    assert client.post(f"{API}/rounds/{rnd['id']}/replicas", json={"count": 3}).status_code == 201
    run_pending(client, seedless)
    evidence = client.get(f"{API}/rounds/{rnd['id']}").json()["evidence"]
    assert evidence["verdict"] == "unknown" and evidence["p_value"] is None, evidence
    assert evidence["seed_ignored"] == ["candidate replicas", "baseline replicas"]
    assert "seed does not reach the training code" in evidence["message"]
    refused = client.post(f"{API}/rounds/{rnd['id']}/decision", json={"adopt": True})
    assert refused.status_code == 409


def test_a_tie_at_another_step_is_not_taken_for_an_ignored_seed() -> None:
    """A coarse metric (an error rate over 100 examples) can tie by chance; the same value at the
    same best step in every run cannot, short of an ignored seed."""
    from hpo.server.analysis.model import TrialSummary
    from hpo.server.analysis.rules.arms import replica_stats

    def run(tid: int, value: float, step: int) -> TrialSummary:
        return TrialSummary(id=tid, number=tid, arm={}, params={}, status="completed", objective=value, best_step=step)

    original = run(1, 0.07, 1800)
    tied = replica_stats([run(2, 0.07, 1500), run(3, 0.08, 1900)], original=original)
    assert tied["seed_ignored"] is False and tied["replica_std"] > 0
    same = replica_stats([run(2, 0.07, 1800), run(3, 0.07, 1800)], original=original)
    assert same["seed_ignored"] is True and same["replica_std"] is None
    assert replica_stats([run(2, 0.07, 1800)], original=original)["seed_ignored"] is True
    assert replica_stats([run(2, 0.07, 1800)])["seed_ignored"] is False  # one run alone tells nothing
